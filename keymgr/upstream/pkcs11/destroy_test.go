//go:build pkcs11

package pkcs11

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// TestDestroyRoot: against the real SoftHSM2 token, CheckDestroy refuses
// a Ref of another upstream, a key not in the token and another root's
// key, destroying nothing; DestroyRoot destroys both halves of the root's
// key pair (pkcs11-tool finds neither), and the other root's stays.
func TestDestroyRoot(t *testing.T) {
	cfg := newToken(t)
	u := newUpstream(t, cfg)
	root, other := newRoot(t, u, certs.KeyECP256), newRoot(t, u, certs.KeyECP256)
	absent := upstream.Ref{Type: Name, Key: keyRef{Label: "absent", ID: []byte{0xde, 0xad}}.String()}
	for _, c := range []struct {
		name string
		ref  upstream.Ref
		want string
	}{
		{"another upstream's", upstream.Ref{Type: "vault-transit", Key: "k:1"}, "not in a PKCS#11 token"},
		{"a key not in the token", absent, "destroy the root key"},
		{"another root's key", other.Ref, "is not the root's key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := u.CheckDestroy(t.Context(), root.Cert, c.ref)
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != upstream.KindRefused || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("CheckDestroy = %v, want refused saying %q", err, c.want)
			}
		})
	}
	if err := u.CheckDestroy(t.Context(), root.Cert, root.Ref); err != nil {
		t.Fatalf("CheckDestroy of the root's own key: %v", err)
	}
	if n := privateKeys(t, cfg); n != 2 {
		t.Fatalf("the checks left %d private keys, want 2", n)
	}
	k, _ := parseKeyRef(root.Ref.Key)
	if n := withID(t, cfg, k.ID); n != 2 {
		t.Fatalf("%d objects of the root's ID before DestroyRoot, want its key pair", n)
	}
	if err := u.DestroyRoot(t.Context(), root.Cert, root.Ref); err != nil {
		t.Fatal(err)
	}
	if n := withID(t, cfg, k.ID); n != 0 {
		t.Errorf("%d objects of the destroyed root's key pair are still in the token", n)
	}
	if n := privateKeys(t, cfg); n != 1 {
		t.Fatalf("%d private keys after DestroyRoot, want the other root's", n)
	}
	if _, err := u.SignIntermediate(t.Context(), request(t, other)); err != nil {
		t.Fatalf("the other root no longer signs: %v", err)
	}
	if _, err := u.SignIntermediate(t.Context(), request(t, root)); upstream.KindOf(err) != upstream.KindRefused {
		t.Fatalf("the destroyed root still signs, or fails as %v: %v", upstream.KindOf(err), err)
	}
}

// TestDestroyOrphan: the key pair of a NewRoot that failed after making
// it is destroyed by KeySigned's Destroy.
func TestDestroyOrphan(t *testing.T) {
	cfg := newToken(t)
	u := newUpstream(t, cfg)
	_, ref, err := u.newKey(t.Context(), certs.KeyECP256, "orphan")
	if err != nil {
		t.Fatal(err)
	}
	if n := privateKeys(t, cfg); n != 1 {
		t.Fatalf("%d private keys, want the new one", n)
	}
	if err := u.destroyOrphan(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	if n := privateKeys(t, cfg); n != 0 {
		t.Fatalf("%d private keys after destroying the orphan, want none", n)
	}
}

// withID counts the token's objects of CKA_ID id, read with pkcs11-tool.
func withID(t *testing.T, cfg Config, id []byte) int {
	t.Helper()
	objs, err := hsm.Objects(cfg.TokenLabel, cfg.PIN)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range objs {
		if strings.EqualFold(o.ID, hex.EncodeToString(id)) {
			n++
		}
	}
	return n
}

// privateKeys counts the token's private keys, read with pkcs11-tool.
func privateKeys(t *testing.T, cfg Config) int {
	t.Helper()
	objs, err := hsm.Objects(cfg.TokenLabel, cfg.PIN)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range objs {
		if o.Class == "Private Key" {
			n++
		}
	}
	return n
}
