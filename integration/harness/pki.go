package harness

import (
	"crypto"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

// ExternalPKI is what meshca needs in front of an external signer (Vault,
// cfssl, k8scsr): a corporate root, the intermediate the external CA signs
// with, and files in Dir for meshca's flags: anchors.pem (the root, for
// --trust-anchors), serving.pem and serving-key.pem (a serving certificate
// for istiod.istio-system.svc under the intermediate), ca.pem and
// ca-key.pem (the intermediate, for a CA server that signs with it).
type ExternalPKI struct {
	Root, Inter *testca.CA
	Dir         string
}

// NewExternalPKI makes the authorities and writes their files into a
// fresh temporary directory.
func NewExternalPKI(tb testing.TB) *ExternalPKI {
	tb.Helper()
	root := testca.NewRoot(tb, "corp root", testca.Options{})
	p := &ExternalPKI{Root: root, Inter: root.NewIntermediate(tb, "corp mesh intermediate", testca.Options{}), Dir: tb.TempDir()}
	serving, err := keymgr.IssueServing(p.Inter.Authority(), keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc"}})
	if err != nil {
		tb.Fatal(err)
	}
	servingKey, err := pemutil.EncodePrivateKey(serving.PrivateKey.(crypto.Signer))
	if err != nil {
		tb.Fatal(err)
	}
	interKey, err := pemutil.EncodePrivateKey(p.Inter.Key)
	if err != nil {
		tb.Fatal(err)
	}
	p.Write(tb, "anchors.pem", pemutil.EncodeCertificates(root.Cert))
	p.Write(tb, "serving.pem", pemutil.EncodeCertificates(serving.Leaf, p.Inter.Cert))
	p.Write(tb, "serving-key.pem", servingKey)
	p.Write(tb, "ca.pem", pemutil.EncodeCertificates(p.Inter.Cert))
	p.Write(tb, "ca-key.pem", interKey)
	return p
}

// Write writes a file of Dir.
func (p *ExternalPKI) Write(tb testing.TB, name string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(p.Path(name), data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// Path is the path of a file of Dir.
func (p *ExternalPKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// ServingArgs are meshca's flags for the pinned root and the serving
// certificate.
func (p *ExternalPKI) ServingArgs() []string {
	return []string{"--trust-anchors", p.Path("anchors.pem"),
		"--serving-cert-file", p.Path("serving.pem"), "--serving-key-file", p.Path("serving-key.pem")}
}
