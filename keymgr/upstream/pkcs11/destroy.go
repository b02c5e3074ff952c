//go:build pkcs11

package pkcs11

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/ThalesGroup/crypto11"
	"github.com/meshca/meshca/keymgr/upstream"
)

var _ upstream.KeyDestroyer = (*Upstream)(nil)

// CheckDestroy reports whether DestroyRoot would destroy the key pair ref
// names: one pair in the token, root's, sensitive and not extractable.
// Every root key in a token is one NewRoot generated (a key is never
// adopted).
func (u *Upstream) CheckDestroy(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	return u.destroy(ctx, root, ref, false)
}

// DestroyRoot destroys the key pair ref names (C_DestroyObject on both
// halves): nothing can sign under the root again.
func (u *Upstream) DestroyRoot(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	return u.destroy(ctx, root, ref, true)
}

func (u *Upstream) destroy(ctx context.Context, root *x509.Certificate, ref upstream.Ref, really bool) error {
	if ref.Type != Name {
		return u.refuse(fmt.Errorf("root %q is kept by upstream %q, not in a PKCS#11 token", root.Subject, ref.Type))
	}
	k, err := parseKeyRef(ref.Key)
	if err != nil {
		return u.refuse(err)
	}
	err = u.tok.do(ctx, func(c *crypto11.Context) error {
		key, err := find(c, k, root.PublicKey)
		if err != nil || !really {
			return err
		}
		return key.Delete()
	})
	return u.classify("destroy the root key "+k.String(), err)
}

// destroyOrphan destroys the key pair of a NewRoot that failed after
// generating it.
func (u *Upstream) destroyOrphan(ctx context.Context, ref upstream.Ref) error {
	k, err := parseKeyRef(ref.Key)
	if err != nil {
		return u.refuse(err)
	}
	err = u.tok.do(ctx, func(c *crypto11.Context) error {
		key, err := find(c, k, nil)
		if err != nil {
			return err
		}
		return key.Delete()
	})
	return u.classify("destroy the new key "+k.String(), err)
}
