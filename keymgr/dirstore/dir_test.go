package dirstore_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
)

func TestLoadOrCreate(t *testing.T) {
	for _, kt := range []certs.KeyType{certs.KeyECP256, certs.KeyECP384, certs.KeyRSA2048} {
		t.Run(string(kt), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			a, created, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{KeyType: kt, Organization: "cluster.local"})
			if err != nil || !created {
				t.Fatalf("first start: created=%v err=%v", created, err)
			}
			if err := a.Validate(time.Now()); err != nil {
				t.Fatal(err)
			}
			checkKeyType(t, a, kt)
			fi, err := os.Stat(filepath.Join(dir, keymgr.FileCAKey))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("key file mode %v, want 0600", fi.Mode().Perm())
			}
			b, created, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{KeyType: kt})
			if err != nil || created {
				t.Fatalf("restart: created=%v err=%v", created, err)
			}
			if !b.Cert.Equal(a.Cert) || len(b.Roots) != 1 || !b.Roots[0].Equal(a.Cert) || len(b.Chain) != 0 {
				t.Fatal("restart did not load the same root")
			}
			if !b.IsRoot() || len(b.Intermediates()) != 0 {
				t.Fatal("a self-signed CA must not send intermediates")
			}
		})
	}
}

func checkKeyType(t *testing.T, a *keymgr.Authority, kt certs.KeyType) {
	t.Helper()
	switch k := a.Cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		want := map[certs.KeyType]elliptic.Curve{certs.KeyECP256: elliptic.P256(), certs.KeyECP384: elliptic.P384()}[kt]
		if k.Curve != want {
			t.Fatalf("curve %v for %s", k.Curve.Params().Name, kt)
		}
	case *rsa.PublicKey:
		if kt != certs.KeyRSA2048 || k.N.BitLen() != 2048 {
			t.Fatalf("RSA %d for %s", k.N.BitLen(), kt)
		}
	}
}

func TestLoadOrCreateRefusesPartialState(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, keymgr.FileCAKey)); err != nil {
		t.Fatal(err)
	}
	_, _, err := dirstore.LoadOrCreate(dir, dirstore.StateOptions{})
	if err == nil || !strings.Contains(err.Error(), "holds only") {
		t.Fatalf("err = %v, want a refusal to overwrite partial state", err)
	}
}
