package istioclient

import (
	"context"
	"crypto"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr/certs"
)

// TestIstiodClientRootsLoadedAtStart documents why meshca restarts
// istiod's Deployment when the roots grow (--istiod-deployment): istiod's
// secure xDS port verifies client certificates with the roots its ca.crt
// held when it started. A root added to the file later is refused, though
// istiod reloads its serving certificate from the same files, and is
// accepted once istiod restarted on them. Should Istio start reloading
// them, the restart becomes unnecessary, and this test says so.
func TestIstiodClientRootsLoadedAtStart(t *testing.T) {
	discoveryBin, _ := istioBinaries(t)
	ns := cluster.Namespace(t, "istiod-roots")
	san := "istiod." + ns + ".svc"
	rootA, rootB := testca.NewRoot(t, "root A", testca.Options{}), testca.NewRoot(t, "root B", testca.Options{})
	dir := t.TempDir()
	tlsVol := &volume{dir: filepath.Join(dir, "var/run/secrets/istiod/tls")}
	caVol := &volume{dir: filepath.Join(dir, "var/run/secrets/istiod/ca")}
	// write lays out a new serving certificate under root A and roots as
	// ca.crt, as the kubelet projects istiod-tls, and returns the leaf.
	write := func(roots ...*x509.Certificate) *x509.Certificate {
		serving := issueLeaf(t, rootA, &x509.Certificate{DNSNames: []string{san}})
		key, err := pemutil.EncodePrivateKey(serving.PrivateKey.(crypto.Signer))
		if err != nil {
			t.Fatal(err)
		}
		bundle := pemutil.EncodeCertificates(roots...)
		for _, err := range []error{
			tlsVol.write(map[string][]byte{"tls.crt": pemutil.EncodeCertificates(serving.Leaf), "tls.key": key, "ca.crt": bundle}),
			caVol.write(map[string][]byte{"root-cert.pem": bundle}),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		return serving.Leaf
	}
	start := func(name string) *istiod {
		d, err := startIstiod(context.Background(), discoveryBin, dir, name, ns, cluster.Kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.stop(); d.saveLog() })
		return d
	}
	id := "spiffe://cluster.local/ns/" + ns + "/sa/probe"
	underA, underB := clientCert(t, rootA, id), clientCert(t, rootB, id)
	probe := func(d *istiod) (errA, errB error) {
		pool := certs.Pool(rootA.Cert)
		return tlsProbe(d.secureAddr, san, pool, underA), tlsProbe(d.secureAddr, san, pool, underB)
	}

	write(rootA.Cert)
	d := start("istiod-roots-1")
	if errA, errB := probe(d); errA != nil || errB == nil {
		t.Fatalf("istiod started with root A: a client certificate under A: %v (want accepted); under B: %v (want refused)", errA, errB)
	}

	leaf := write(rootA.Cert, rootB.Cert)
	if !eventually(10*time.Second, func() bool {
		chain, err := harness.ServingChain(d.secureAddr, san, certs.Pool(rootA.Cert))
		return err == nil && chain[0].Equal(leaf)
	}) {
		t.Fatal("istiod did not reload its serving certificate within 10s of the files' change")
	}
	if _, errB := probe(d); errB == nil {
		t.Fatal("istiod, started with root A, accepted a client certificate under root B once its ca.crt held B: " +
			"it reloads its client roots now, and meshca's restart of istiod (--istiod-deployment) is unnecessary")
	} else {
		t.Logf("root B in ca.crt, istiod reloaded its certificate, still refuses B: %v", errB)
	}

	d.stop()
	d = start("istiod-roots-2")
	if errA, errB := probe(d); errA != nil || errB != nil {
		t.Fatalf("istiod restarted with roots A and B: a client certificate under A: %v, under B: %v (want both accepted)", errA, errB)
	}
}
