package kuberest

import (
	"errors"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// TestForGroupVersion: the client's paths are the API server's for the
// core group (/api) and a named group (/apis), its rate limit is the
// config's, and a bad scheme or no config is an error. The calls
// themselves run against a real kube-apiserver in nat/ha/leasefence and
// gwimage/cmd/natgw (TestLeaseFence, TestSiblingPeerFollow).
func TestForGroupVersion(t *testing.T) {
	rc := &rest.Config{Host: "http://127.0.0.1:1", QPS: 100, Burst: 200}
	for _, c := range []struct {
		gv       schema.GroupVersion
		add      func(*runtime.Scheme) error
		resource string
		want     string
	}{
		{corev1.SchemeGroupVersion, corev1.AddToScheme, "pods", "/api/v1/namespaces/ns/pods/x"},
		{coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme, "leases", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/x"},
	} {
		client, err := ForGroupVersion(rc, c.gv, c.add)
		if err != nil {
			t.Fatalf("%s: %v", c.gv, err)
		}
		if got := client.Get().Namespace("ns").Resource(c.resource).Name("x").URL().Path; got != c.want {
			t.Errorf("%s: path %s, want %s", c.gv, got, c.want)
		}
		if got := client.GetRateLimiter().QPS(); got != 100 {
			t.Errorf("%s: QPS %v, want the config's 100", c.gv, got)
		}
	}
	if rc.GroupVersion != nil || rc.NegotiatedSerializer != nil {
		t.Error("ForGroupVersion changed the caller's config")
	}
	bad := errors.New("no such type")
	if _, err := ForGroupVersion(rc, corev1.SchemeGroupVersion, func(*runtime.Scheme) error { return bad }); !errors.Is(err, bad) || !strings.Contains(err.Error(), "scheme of v1") {
		t.Errorf("a failing scheme: %v, want its error with the group version", err)
	}
	if _, err := ForGroupVersion(nil, corev1.SchemeGroupVersion, corev1.AddToScheme); err == nil {
		t.Error("no config: no error")
	}
}
