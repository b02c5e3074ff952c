package upstream_test

import (
	"context"
	"crypto"
	"crypto/x509/pkix"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// brokenKey is a key NewKey made whose signatures fail: the root's
// certificate cannot be made after the key exists.
type brokenKey struct{ crypto.Signer }

func (brokenKey) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("the token went away")
}

// TestKeySignedNewRootOrphan: a NewRoot whose certificate step fails
// after NewKey made the key destroys that key, or names it in its error
// for an operator to delete; the error keeps its kind.
func TestKeySignedNewRootOrphan(t *testing.T) {
	ref := upstream.Ref{Type: "test", Key: "meshca-root-x:1"}
	cases := []struct {
		name      string
		destroy   func(context.Context, upstream.Ref) error
		destroyed bool
		want      string
	}{
		{"no destroyer: named", nil, false, "the new key test meshca-root-x:1 is left in the upstream, recorded nowhere: delete it"},
		{"destroyed", func(context.Context, upstream.Ref) error { return nil }, true, "the new key test meshca-root-x:1 was destroyed"},
		{"destroy fails: named", func(context.Context, upstream.Ref) error { return errors.New("deletion_allowed is false") }, true,
			"the new key test meshca-root-x:1 is left in the upstream, recorded nowhere, and destroying it failed (deletion_allowed is false): delete it"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []upstream.Ref
			u := &upstream.KeySigned{Name: "test",
				NewKey: func(context.Context, certs.KeyType, string) (crypto.Signer, upstream.Ref, error) {
					key, err := certs.GenerateKey(certs.KeyECP256)
					return brokenKey{key}, ref, err
				}}
			if c.destroy != nil {
				u.Destroy = func(ctx context.Context, r upstream.Ref) error {
					if ctx.Err() != nil {
						t.Error("destroy got an ended context")
					}
					got = append(got, r)
					return c.destroy(ctx, r)
				}
			}
			_, err := u.NewRoot(t.Context(), &upstream.RootRequest{KeyType: certs.KeyECP256, Subject: pkix.Name{CommonName: "r"}, TTL: time.Hour})
			var ue *upstream.Error
			if !errors.As(err, &ue) || ue.Kind != upstream.KindInternal || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "the token went away") {
				t.Fatalf("err = %v, want an internal *upstream.Error saying %q", err, c.want)
			}
			if c.destroyed != (len(got) == 1 && got[0] == ref) {
				t.Fatalf("destroyed %v, want %v of %v", got, c.destroyed, ref)
			}
		})
	}
}
