package integration

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// kubePKI is the cluster's certificate authority and the files made
// from it, all under one directory.
type kubePKI struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
}

// certSpec describes one certificate the CA signs.
type certSpec struct {
	name   string // file stem: NAME.crt and NAME.key
	cn     string
	orgs   []string
	ips    []net.IP
	dns    []string
	server bool // server auth; otherwise client auth
}

// newKubePKI makes a CA valid for a day and writes ca.crt and ca.key.
func newKubePKI(dir string) (*kubePKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vmshim-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &kubePKI{dir: dir, caCert: cert, caKey: key}
	if err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	return p, nil
}

// path returns the path of a file in the PKI directory.
func (p *kubePKI) path(name string) string { return filepath.Join(p.dir, name) }

// caPEM returns the CA certificate in PEM.
func (p *kubePKI) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.caCert.Raw})
}

// issue signs a certificate for spec and writes NAME.crt and NAME.key.
func (p *kubePKI) issue(spec certSpec) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate key for %s: %w", spec.name, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	usage := x509.ExtKeyUsageClientAuth
	if spec.server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.cn, Organization: spec.orgs},
		NotBefore:    p.caCert.NotBefore,
		NotAfter:     p.caCert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  spec.ips,
		DNSNames:     spec.dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return fmt.Errorf("sign certificate %s: %w", spec.name, err)
	}
	return p.write(spec.name, der, key)
}

// write stores a certificate and its key as NAME.crt and NAME.key.
func (p *kubePKI) write(name string, der []byte, key crypto.Signer) error {
	if err := os.WriteFile(p.path(name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeKey(p.path(name+".key"), key)
}

// writeKey writes a private key in PKCS #8 PEM, readable by root only.
func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key %s: %w", path, err)
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// serviceAccountKeys writes the key pair that signs and verifies service
// account tokens: sa.key (private) and sa.pub.
func (p *kubePKI) serviceAccountKeys() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service account key: %w", err)
	}
	if err := writeKey(p.path("sa.key"), key); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	return os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
}

// kubeconfig writes a kubeconfig for the client certificate NAME that
// talks to server, and returns its path.
func (p *kubePKI) kubeconfig(name, server string) (string, error) {
	path := p.path(name + ".kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: vmshim
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: vmshim
  context:
    cluster: vmshim
    user: %s
current-context: vmshim
`, server, p.path("ca.crt"), name, p.path(name+".crt"), p.path(name+".key"), name)
	return path, os.WriteFile(path, []byte(body), 0o600)
}

// clusterCerts makes the certificates of the control plane: the serving
// certificate of the API server (every name and IP a client may use for
// it), the client certificates of the admin, the API server (towards
// the kubelets), the controller manager and the scheduler, and the
// service account key pair. Each node's come from nodeCerts.
func (p *kubePKI) clusterCerts(apiIP, serviceIP net.IP) error {
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			ips: []net.IP{apiIP, serviceIP, net.IPv4(127, 0, 0, 1)},
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}},
		{name: "admin", cn: "vmshim-admin", orgs: []string{"system:masters"}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return err
		}
	}
	return p.serviceAccountKeys()
}

// nodeCerts makes a kubelet's certificates: STEM.crt, its client
// certificate as the node nodeName, and STEM-serving.crt for its
// address.
func (p *kubePKI) nodeCerts(stem, nodeName string, nodeIP net.IP) error {
	if err := p.issue(certSpec{name: stem + "-serving", cn: nodeName, server: true, ips: []net.IP{nodeIP}, dns: []string{nodeName}}); err != nil {
		return err
	}
	return p.issue(certSpec{name: stem, cn: "system:node:" + nodeName, orgs: []string{"system:nodes"}})
}
