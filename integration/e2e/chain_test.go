package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
)

// TestChainLayoutPluggedCA: with a plugged-in intermediate and two trusted
// roots (a rotation in progress), the reply is leaf, intermediate, and one
// last element holding both roots; no root among the intermediates.
func TestChainLayoutPluggedCA(t *testing.T) {
	root := testca.NewRoot(t, "corp root", testca.Options{})
	next := testca.NewRoot(t, "corp next root", testca.Options{})
	inter := root.NewIntermediate(t, "mesh intermediate", testca.Options{})
	dir := t.TempDir()
	keyPEM, err := pemutil.EncodePrivateKey(inter.Key)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		keymgr.FileCACert:    pemutil.EncodeCertificates(inter.Cert),
		keymgr.FileCAKey:     keyPEM,
		keymgr.FileCertChain: pemutil.EncodeCertificates(inter.Cert, root.Cert),
		keymgr.FileRootCert:  pemutil.EncodeCertificates(root.Cert, next.Cert),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := harness.StartMeshca(t, bin, "--ca-dir", dir, "--kubeconfig", cluster.Kubeconfig)
	w := cluster.NewWorkload(t, cluster.Namespace(t, "chain"), "frontend", "node-a")
	id := workloadID(w)
	s := &server{Meshca: m, rootsPEM: files[keymgr.FileRootCert]}
	s.roots = mustPool(t, s.rootsPEM)
	key, csrPEM := newKeyAndCSR(t, id)
	chain, err := s.client(t, w.Token).Call(context.Background(), csrPEM, id, caclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 3 {
		t.Fatalf("%d elements, want leaf, intermediate, roots", len(chain))
	}
	if c, err := pemutil.ParseCertificates([]byte(chain[1])); err != nil || len(c) != 1 || !c[0].Equal(inter.Cert) {
		t.Fatalf("element 1 is not exactly the intermediate (%v)", err)
	}
	roots, err := pemutil.ParseCertificates([]byte(chain[2]))
	if err != nil || len(roots) != 2 || !roots[0].Equal(root.Cert) || !roots[1].Equal(next.Cert) {
		t.Fatalf("last element: %d roots (%v), want both", len(roots), err)
	}
	if _, err := checked.Check(t, chain, id, key); err != nil {
		t.Fatal(err)
	}
}
