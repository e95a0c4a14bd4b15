package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// cert is one certificate of the cluster's PKI, signed by its CA.
type cert struct {
	name    string // file stem: name.crt, name.key
	subject string // openssl -subj
	server  bool   // serverAuth (else clientAuth)
	sans    []string
}

// pkiCerts lists the certificates the cluster needs.
func (c *Cluster) pkiCerts() []cert {
	ip := c.cfg.NodeIP
	return []cert{
		{name: "apiserver", subject: "/CN=kube-apiserver", server: true, sans: []string{
			"IP:" + ip, "IP:127.0.0.1", "IP:" + c.cfg.APIServiceIP, "DNS:kubernetes", "DNS:kubernetes.default",
			"DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost"}},
		{name: "kubelet", subject: "/CN=" + c.cfg.NodeName, server: true, sans: []string{"IP:" + ip, "DNS:" + c.cfg.NodeName}},
		{name: "admin", subject: "/O=system:masters/CN=natgw-cluster-admin"},
		{name: "apiserver-kubelet-client", subject: "/O=system:masters/CN=kube-apiserver-kubelet-client"},
		{name: "controller-manager", subject: "/CN=system:kube-controller-manager"},
		{name: "scheduler", subject: "/CN=system:kube-scheduler"},
		{name: "node", subject: "/O=system:nodes/CN=system:node:" + c.cfg.NodeName},
	}
}

// makePKI writes the CA, the certificates and the service-account key pair
// into dir with openssl. EC P-256 keys (fast to make); the service-account
// key is RSA.
func makePKI(ctx context.Context, dir string, certs []cert) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	p := func(n string) string { return filepath.Join(dir, n) }
	ec := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"}
	if err := run(ctx, "openssl", append(append([]string{"req", "-x509"}, ec...),
		"-keyout", p("ca.key"), "-out", p("ca.crt"), "-days", "30", "-subj", "/CN=natgw-cluster-ca",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")...); err != nil {
		return fmt.Errorf("pki: CA: %w", err)
	}
	for i, ct := range certs {
		if err := run(ctx, "openssl", append(append([]string{"req", "-new"}, ec...),
			"-keyout", p(ct.name+".key"), "-out", p(ct.name+".csr"), "-subj", ct.subject)...); err != nil {
			return fmt.Errorf("pki: %s: %w", ct.name, err)
		}
		ext := "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
		if ct.server {
			ext += "extendedKeyUsage=serverAuth,clientAuth\n"
		} else {
			ext += "extendedKeyUsage=clientAuth\n"
		}
		if len(ct.sans) > 0 {
			ext += "subjectAltName=" + strings.Join(ct.sans, ",") + "\n"
		}
		if err := os.WriteFile(p(ct.name+".ext"), []byte(ext), 0o600); err != nil {
			return fmt.Errorf("pki: %w", err)
		}
		if err := run(ctx, "openssl", "x509", "-req", "-in", p(ct.name+".csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"),
			"-set_serial", fmt.Sprint(1000+i), "-days", "30", "-extfile", p(ct.name+".ext"), "-out", p(ct.name+".crt")); err != nil {
			return fmt.Errorf("pki: sign %s: %w", ct.name, err)
		}
	}
	if err := run(ctx, "openssl", "genrsa", "-out", p("sa.key"), "2048"); err != nil {
		return fmt.Errorf("pki: service-account key: %w", err)
	}
	if err := run(ctx, "openssl", "rsa", "-in", p("sa.key"), "-pubout", "-out", p("sa.pub")); err != nil {
		return fmt.Errorf("pki: service-account public key: %w", err)
	}
	return nil
}

// kubeconfig renders a kubeconfig for the client certificate name.
func (c *Cluster) kubeconfig(name string) string {
	pki := c.path(c.pkiDir)
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: natgw
  cluster:
    server: %s
    certificate-authority: %s/ca.crt
users:
- name: %s
  user:
    client-certificate: %s/%s.crt
    client-key: %s/%s.key
contexts:
- name: natgw
  context: {cluster: natgw, user: %s}
current-context: natgw
`, c.Server(), pki, name, pki, name, pki, name, name)
}
