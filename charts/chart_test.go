// Package charts_test checks the Helm chart charts/natgw-controller
// against the kustomization controller/config, object by object, so that
// the two ways of installing natgw-controller cannot drift; and that both
// name the image `make image` builds (gwimage/version/RELEASE). Rootless:
// it runs helm template and kubectl kustomize only (e2e/firstrun installs
// the chart into a cluster).
package charts_test

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/gwimage/images"
	"github.com/natgw/natgw/gwimage/version"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/manifests"
)

const ns = "natgw-system"

// chartOnlyLabels are the labels the chart adds to every object's
// metadata (Helm's convention); nothing else may differ.
var chartOnlyLabels = []string{"app.kubernetes.io/managed-by", "helm.sh/chart"}

func repo(t *testing.T) string {
	t.Helper()
	r, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// needBinaries skips without helm or kubectl, or fails when the run must
// have them (make test sets NATGW_CLUSTER_REQUIRED=1 after building both).
func needBinaries(t *testing.T, r string) {
	t.Helper()
	if why := manifests.Missing(r); why != "" {
		if os.Getenv("NATGW_CLUSTER_REQUIRED") == "1" {
			t.Fatalf("missing %s, but NATGW_CLUSTER_REQUIRED=1", why)
		}
		t.Skipf("missing %s", why)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// TestVersionOnePlace: the chart's version and appVersion, the image
// controller/config deploys and the image `make image` builds are all
// gwimage/version/RELEASE.
func TestVersionOnePlace(t *testing.T) {
	r := repo(t)
	rel := version.Release()
	if rel == "" || strings.ContainsAny(rel, " \n:") {
		t.Fatalf("gwimage/version/RELEASE = %q, want a version such as 0.1.0", rel)
	}
	b, err := os.ReadFile(filepath.Join(r, manifests.Chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	want := "docker.io/natgw/natgw-controller:" + rel
	built := images.Controller(r, rel).Name
	deployed, err := clusterstack.ManifestImage(r)
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(r, "mk/gwimage.mk"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"Chart.yaml version", chart.Version, rel},
		{"Chart.yaml appVersion", chart.AppVersion, rel},
		{"make image's controller image (images.Controller)", built, want},
		{"controller/config's image", deployed, want},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q (gwimage/version/RELEASE is %s)", c.what, c.got, c.want, rel)
		}
	}
	if !strings.Contains(string(mk), "NATGW_VERSION ?= $(shell cat $(CURDIR)/gwimage/version/RELEASE)") {
		t.Errorf("mk/gwimage.mk does not take NATGW_VERSION from gwimage/version/RELEASE")
	}
}

// stripChartLabels removes chartOnlyLabels from o's metadata.labels (and
// the map when nothing else is left), and fails when one is missing (the
// chart labels every object).
func stripChartLabels(t *testing.T, o manifests.Object) {
	t.Helper()
	md := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	for _, l := range chartOnlyLabels {
		if _, ok := labels[l]; !ok {
			t.Errorf("%s: no label %s", manifests.Key(o), l)
		}
		delete(labels, l)
	}
	if labels != nil && len(labels) == 0 {
		delete(md, "labels")
	}
}

// kustomizeClusterScoped are cluster-scoped kinds kustomize does not know
// (its namespace transformer sets metadata.namespace on them, which the
// API server ignores); the chart renders them without a namespace.
var kustomizeClusterScoped = map[string]bool{"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true}

// normalizeKustomize drops the namespace kustomize sets on the kinds of
// kustomizeClusterScoped, re-keying them.
func normalizeKustomize(objs map[string]manifests.Object) map[string]manifests.Object {
	out := map[string]manifests.Object{}
	for _, o := range objs {
		if kind, _ := o["kind"].(string); kustomizeClusterScoped[kind] {
			delete(o["metadata"].(map[string]any), "namespace")
		}
		out[manifests.Key(o)] = o
	}
	return out
}

// same compares want and got object by object and reports each
// difference with both objects as JSON.
func same(t *testing.T, what string, want, got map[string]manifests.Object) {
	t.Helper()
	if w, g := manifests.Keys(want), manifests.Keys(got); !reflect.DeepEqual(w, g) {
		t.Errorf("%s: objects differ:\n kustomize: %v\n helm:      %v", what, w, g)
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			continue
		}
		if !reflect.DeepEqual(w, g) {
			wj, _ := json.MarshalIndent(w, "", " ")
			gj, _ := json.MarshalIndent(g, "", " ")
			t.Errorf("%s: %s differs:\n--- kustomize\n%s\n--- helm\n%s", what, k, wj, gj)
		}
	}
}

// TestTemplateMatchesKustomize: helm template with crds.install=true
// renders exactly controller/config's objects but the Namespace (helm
// install --create-namespace makes it), with Helm's two labels added; the
// defaults render the same without the CRDs and nothing of the webhook.
func TestTemplateMatchesKustomize(t *testing.T) {
	r := repo(t)
	needBinaries(t, r)
	c := ctx(t)
	kust, err := manifests.Kustomize(c, r, "controller/config")
	if err != nil {
		t.Fatal(err)
	}
	kust = normalizeKustomize(kust)
	if _, ok := kust["Namespace//"+ns]; !ok {
		t.Fatalf("kubectl kustomize controller/config has no Namespace %s: %v", ns, manifests.Keys(kust))
	}
	delete(kust, "Namespace//"+ns)
	for _, tc := range []struct {
		name string
		set  []string
		crds bool
	}{
		{"crds installed", []string{"crds.install=true"}, true},
		{"defaults", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := manifests.Template(c, r, ns, tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]manifests.Object{}
			crds := 0
			for k, o := range kust {
				if o["kind"] == "CustomResourceDefinition" {
					crds++
					if !tc.crds {
						continue
					}
				}
				want[k] = o
			}
			if crds != 6 {
				t.Fatalf("controller/config has %d CRDs, want 6", crds)
			}
			for _, o := range got {
				stripChartLabels(t, o)
			}
			same(t, "helm template "+strings.Join(tc.set, " "), want, got)
		})
	}
}

// TestTemplateWebhook: webhook.enabled adds controller/config/webhook's
// Service and ValidatingWebhookConfiguration, the flags and the mounted
// certificate; the chart's own certificate is for the Service's name and
// signed by the caBundle it sets; with cert-manager, a Certificate, a
// self-signed Issuer (or the given one) and the CA injection annotation.
func TestTemplateWebhook(t *testing.T) {
	r := repo(t)
	needBinaries(t, r)
	c := ctx(t)
	kust, err := manifests.Kustomize(c, r, "controller/config/webhook")
	if err != nil {
		t.Fatal(err)
	}
	svcKey, vwcKey := "Service/"+ns+"/natgw-webhook", "ValidatingWebhookConfiguration//natgw-validate"
	t.Run("self-signed", func(t *testing.T) {
		got, err := manifests.Template(c, r, ns, "webhook.enabled=true")
		if err != nil {
			t.Fatal(err)
		}
		sec := got["Secret/"+ns+"/natgw-webhook-tls"]
		if sec == nil {
			t.Fatalf("no Secret natgw-webhook-tls: %v", manifests.Keys(got))
		}
		data := sec["data"].(map[string]any)
		ca, crt := decodePEM(t, data["ca.crt"]), decodePEM(t, data["tls.crt"])
		vwc := got[vwcKey]
		hook := vwc["webhooks"].([]any)[0].(map[string]any)
		cc := hook["clientConfig"].(map[string]any)
		if cc["caBundle"] != data["ca.crt"] {
			t.Errorf("caBundle is not the Secret's ca.crt")
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		if _, err := crt.Verify(x509.VerifyOptions{DNSName: "natgw-webhook." + ns + ".svc", Roots: pool}); err != nil {
			t.Errorf("serving certificate: %v", err)
		}
		delete(cc, "caBundle")
		kvwc := deepCopy(t, kust[vwcKey])
		delete(kvwc["metadata"].(map[string]any), "annotations")
		for k, w := range map[string]manifests.Object{svcKey: kust[svcKey], vwcKey: kvwc} {
			stripChartLabels(t, got[k])
			same(t, "webhook", map[string]manifests.Object{k: w}, map[string]manifests.Object{k: got[k]})
		}
		dep := got["Deployment/"+ns+"/natgw-controller"]
		ctr := container(dep)
		args := strings.Join(toStrings(ctr["args"]), " ")
		for _, a := range []string{"--webhook-port=9443", "--webhook-cert-dir=/webhook-certs"} {
			if !strings.Contains(args, a) {
				t.Errorf("controller args %q lack %s", args, a)
			}
		}
		vols, _ := json.Marshal(dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"])
		if !strings.Contains(string(vols), `"secretName":"natgw-webhook-tls"`) {
			t.Errorf("volumes %s do not mount natgw-webhook-tls", vols)
		}
	})
	for _, tc := range []struct {
		name   string
		set    []string
		issuer string
	}{
		{"cert-manager self-signed issuer", []string{"webhook.enabled=true", "webhook.certManager.enabled=true"}, "natgw-webhook-selfsigned"},
		{"cert-manager given issuer", []string{"webhook.enabled=true", "webhook.certManager.enabled=true", "webhook.certManager.issuerRef.name=corp-ca", "webhook.certManager.issuerRef.kind=ClusterIssuer"}, "corp-ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := manifests.Template(c, r, ns, tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := got["Secret/"+ns+"/natgw-webhook-tls"]; ok {
				t.Errorf("a Secret natgw-webhook-tls rendered: cert-manager writes it")
			}
			_, selfIssuer := got["Issuer/"+ns+"/natgw-webhook-selfsigned"]
			if selfIssuer != (tc.issuer == "natgw-webhook-selfsigned") {
				t.Errorf("self-signed Issuer rendered: %v, want %v", selfIssuer, !selfIssuer)
			}
			cert := got["Certificate/"+ns+"/natgw-webhook"]
			if cert == nil {
				t.Fatalf("no Certificate: %v", manifests.Keys(got))
			}
			spec := cert["spec"].(map[string]any)
			if spec["issuerRef"].(map[string]any)["name"] != tc.issuer || spec["secretName"] != "natgw-webhook-tls" {
				t.Errorf("Certificate spec %v: want issuer %s, secret natgw-webhook-tls", spec, tc.issuer)
			}
			stripChartLabels(t, got[vwcKey])
			stripChartLabels(t, got[svcKey])
			same(t, "webhook with cert-manager", map[string]manifests.Object{svcKey: kust[svcKey], vwcKey: kust[vwcKey]},
				map[string]manifests.Object{svcKey: got[svcKey], vwcKey: got[vwcKey]})
		})
	}
}

// TestTemplateHA: provisioning.ha renders controller/config/ha's
// ServiceAccount, Roles and RoleBindings (the gateway pods' Lease rights,
// natgw-controller's read access to the Leases) in podNamespace (the
// gateway ServiceAccount subject too); off, none of them.
func TestTemplateHA(t *testing.T) {
	r := repo(t)
	needBinaries(t, r)
	c := ctx(t)
	kust, err := manifests.Kustomize(c, r, "controller/config/ha")
	if err != nil {
		t.Fatal(err)
	}
	if len(kust) != 5 {
		t.Fatalf("controller/config/ha: %v, want a ServiceAccount, two Roles and two RoleBindings", manifests.Keys(kust))
	}
	prov := []string{"provisioning.enabled=true", "provisioning.gatewayImage=g"}
	for _, podNS := range []string{"kube-system", "gw"} {
		t.Run(podNS, func(t *testing.T) {
			got, err := manifests.Template(c, r, ns, append(prov, "provisioning.ha=true", "podNamespace="+podNS)...)
			if err != nil {
				t.Fatal(err)
			}
			for k, o := range kust {
				o = deepCopy(t, o)
				o["metadata"].(map[string]any)["namespace"] = podNS
				if subs, ok := o["subjects"].([]any); ok {
					for _, s := range subs {
						// The gateway pods' ServiceAccount is in podNamespace,
						// natgw-controller's in the release's.
						if s.(map[string]any)["name"] == "natgw-gateway" {
							s.(map[string]any)["namespace"] = podNS
						}
					}
				}
				k = strings.Replace(k, "/kube-system/", "/"+podNS+"/", 1)
				stripChartLabels(t, got[k])
				same(t, "ha", map[string]manifests.Object{k: o}, map[string]manifests.Object{k: got[k]})
			}
		})
	}
	// provisioning.gatewayNamespaces: the same objects in each listed
	// namespace as well as in podNamespace.
	got, err := manifests.Template(c, r, ns, append(prov, "provisioning.ha=true", "provisioning.gatewayNamespaces={team-a,team-b}")...)
	if err != nil {
		t.Fatal(err)
	}
	for _, gwNS := range []string{"kube-system", "team-a", "team-b"} {
		for k := range kust {
			k = strings.Replace(k, "/kube-system/", "/"+gwNS+"/", 1)
			if _, ok := got[k]; !ok {
				t.Errorf("provisioning.gatewayNamespaces: %s not rendered (have %v)", k, manifests.Keys(got))
			}
		}
	}
	got, err = manifests.Template(c, r, ns, prov...)
	if err != nil {
		t.Fatal(err)
	}
	for k := range kust {
		if _, ok := got[k]; ok {
			t.Errorf("provisioning.ha off: %s rendered", k)
		}
	}
}

// TestTemplateValues: the values reach the controller's flags, and values
// the controller would refuse fail the render with the value's name.
func TestTemplateValues(t *testing.T) {
	r := repo(t)
	needBinaries(t, r)
	c := ctx(t)
	for _, tc := range []struct {
		name     string
		set      []string
		args     []string // in the controller's args
		notArgs  []string // not in them
		replicas float64
		image    string
		err      string
	}{
		{name: "defaults", args: []string{"--dataplane=nftables", "--transport=exec", "--natgw-binary=/natgw", "--workers=" + strconv.Itoa(reconciler.DefaultWorkers), "--leader-elect"}, notArgs: []string{"--mode", "--provision-gateways", "--ha-gateways", "--webhook-port", "--network-source", "--pod-namespace"}, replicas: 2, image: "docker.io/natgw/natgw-controller:" + version.Release()},
		{name: "iptables, 3 replicas, workers", set: []string{"dataplane=iptables", "replicas=3", "workers=8"}, args: []string{"--dataplane=iptables", "--workers=8"}, replicas: 3},
		{name: "companion", set: []string{"mode=companion", "admissionPolicy.enabled=false"}, args: []string{"--mode=companion"}, replicas: 2},
		{name: "provisioning", set: []string{"provisioning.enabled=true", "provisioning.gatewayImage=docker.io/natgw/natgw:0.1.0", "networkSource=kube-ovn", "podNamespace=gw"}, args: []string{"--provision-gateways", "--gateway-image=docker.io/natgw/natgw:0.1.0", "--service-cluster-ip-range=10.96.0.0/12", "--network-source=kube-ovn", "--pod-namespace=gw"}, replicas: 2},
		{name: "image", set: []string{"image.repository=registry.example/natgw-controller", "image.tag=0.2.0", "extraArgs={--rule-labels}"}, args: []string{"--rule-labels"}, replicas: 2, image: "registry.example/natgw-controller:0.2.0"},
		{name: "bad mode", set: []string{"mode=both"}, err: `mode: "both", want replace or companion`},
		{name: "bad dataplane", set: []string{"dataplane=ebpf"}, err: `dataplane: "ebpf", want nftables or iptables`},
		{name: "bad network source", set: []string{"networkSource=ipam"}, err: `networkSource: "ipam"`},
		{name: "companion with the admission policy", set: []string{"mode=companion"}, err: "admissionPolicy.enabled: true with mode companion"},
		{name: "companion with the webhook", set: []string{"mode=companion", "admissionPolicy.enabled=false", "webhook.enabled=true"}, err: "webhook.enabled: true with mode companion"},
		{name: "provisioning without image", set: []string{"provisioning.enabled=true"}, err: "provisioning.gatewayImage: empty"},
		{name: "ha", set: []string{"provisioning.enabled=true", "provisioning.gatewayImage=g", "provisioning.ha=true"}, args: []string{"--provision-gateways", "--ha-gateways"}, replicas: 2},
		{name: "gateway namespaces", set: []string{"provisioning.enabled=true", "provisioning.gatewayImage=g", "provisioning.gatewayNamespaces={team-a,team-b}"}, args: []string{"--provision-gateways", "--gateway-namespaces=team-a,team-b"}, replicas: 2},
		{name: "ha without provisioning", set: []string{"provisioning.ha=true"}, err: "provisioning.ha: true, but provisioning.enabled is false"},
		{name: "zero replicas", set: []string{"replicas=0"}, err: "replicas: 0, want 1 or more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := manifests.Template(c, r, ns, tc.set...)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("helm template --set %v: error %v, want one containing %q", tc.set, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dep := got["Deployment/"+ns+"/natgw-controller"]
			if dep == nil {
				t.Fatalf("no Deployment: %v", manifests.Keys(got))
			}
			if n := dep["spec"].(map[string]any)["replicas"]; n != tc.replicas {
				t.Errorf("replicas %v, want %v", n, tc.replicas)
			}
			ctr := container(dep)
			args := toStrings(ctr["args"])
			joined := " " + strings.Join(args, " ") + " "
			for _, a := range tc.args {
				if !strings.Contains(joined, " "+a+" ") {
					t.Errorf("args %q lack %s", args, a)
				}
			}
			for _, a := range tc.notArgs {
				if strings.Contains(joined, " "+a) {
					t.Errorf("args %q have %s", args, a)
				}
			}
			if tc.image != "" && ctr["image"] != tc.image {
				t.Errorf("image %v, want %s", ctr["image"], tc.image)
			}
		})
	}
}

// TestLint: helm lint --strict passes on the defaults and with every
// optional part on.
func TestLint(t *testing.T) {
	r := repo(t)
	needBinaries(t, r)
	for _, set := range [][]string{
		nil,
		{"crds.install=true", "webhook.enabled=true", "provisioning.enabled=true", "provisioning.gatewayImage=docker.io/natgw/natgw:0.1.0", "provisioning.ha=true"},
		{"webhook.enabled=true", "webhook.certManager.enabled=true"},
	} {
		if out, err := manifests.Lint(ctx(t), r, set...); err != nil {
			t.Errorf("helm lint --set %v: %v\n%s", set, err, out)
		}
	}
}

func container(dep manifests.Object) map[string]any {
	spec := dep["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return spec["containers"].([]any)[0].(map[string]any)
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func decodePEM(t *testing.T, v any) *x509.Certificate {
	t.Helper()
	s, _ := v.(string)
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("certificate data %.20q…: %v", s, err)
	}
	blk, _ := pem.Decode(raw)
	if blk == nil {
		t.Fatalf("certificate data is not PEM")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func deepCopy(t *testing.T, o manifests.Object) manifests.Object {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var c manifests.Object
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}
