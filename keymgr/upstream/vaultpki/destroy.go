package vaultpki

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/keymgr/upstream"
)

var _ upstream.KeyDestroyer = (*Upstream)(nil)

// madePrefix starts the name of every issuer NewRoot makes; an issuer of
// another name is the organisation's (Config.Issuer), and theirs to
// delete.
const madePrefix = "meshca-root-"

// CheckDestroy reports whether DestroyRoot would delete the issuer ref
// names and its key: an issuer NewRoot made (named meshca-root-...), whose
// certificate is root.
func (u *Upstream) CheckDestroy(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	_, err := u.destroyable(ctx, root, ref)
	return err
}

// DestroyRoot deletes the issuer ref names, then its key: Vault can sign
// nothing more under the root.
func (u *Upstream) DestroyRoot(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	keyID, err := u.destroyable(ctx, root, ref)
	if err != nil {
		return err
	}
	for _, path := range []string{u.c.Mount + "/issuer/" + ref.Key, u.c.Mount + "/key/" + keyID} {
		if err := u.delete(ctx, path); err != nil {
			return err
		}
	}
	return nil
}

func (u *Upstream) delete(ctx context.Context, path string) error {
	_, err := u.sess.Do(ctx, path, func(ctx context.Context, l *api.Logical) (*api.Secret, error) { return l.DeleteWithContext(ctx, path) })
	if err != nil {
		return upstreamError(fmt.Errorf("delete %s: %w", path, err))
	}
	return nil
}

// destroyable is the key ID of the issuer ref names, when DestroyRoot may
// delete both.
func (u *Upstream) destroyable(ctx context.Context, root *x509.Certificate, ref upstream.Ref) (string, error) {
	if ref.Type != Name || ref.Key == "" || strings.ContainsAny(ref.Key, "/?#") {
		return "", errorf(upstream.KindRefused, "root %q is kept by %q, not by a Vault PKI issuer", root.Subject, ref.Type+" "+ref.Key)
	}
	path := u.c.Mount + "/issuer/" + ref.Key
	s, err := u.sess.Read(ctx, path)
	switch {
	case err != nil:
		return "", upstreamError(err)
	case s == nil:
		return "", errorf(upstream.KindRefused, "%s: no such issuer in Vault", path)
	}
	name, _ := dataString(s, "issuer_name")
	keyID, _ := dataString(s, "key_id")
	cert, err := certificateOf(s, "certificate")
	switch {
	case err != nil:
		return "", errorf(upstream.KindInternal, "%s: %v", path, err)
	case !cert.Equal(root):
		return "", errorf(upstream.KindRefused, "%s (%s) is not root %q", path, name, root.Subject)
	case !strings.HasPrefix(name, madePrefix):
		return "", errorf(upstream.KindRefused, "%s (%q) was not made by meshca (--vault-pki-issuer adopts an issuer): its owner deletes it", path, name)
	case keyID == "":
		return "", errorf(upstream.KindRefused, "%s has no key in Vault", path)
	}
	return keyID, nil
}

// orphan is the error of a NewRoot that made the issuer id, then failed:
// the issuer and its key are deleted, or the error names them.
func (u *Upstream) orphan(ctx context.Context, is Issuer, err error) error {
	e := upstreamError(err).(*upstream.Error)
	if is.ID == "" {
		return e
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upstream.OrphanTimeout)
	defer cancel()
	if derr := u.DestroyRoot(dctx, is.Cert, upstream.Ref{Type: Name, Key: is.ID}); derr != nil {
		e.Err = fmt.Errorf("%w; the new issuer %s/issuer/%s is left in Vault, recorded nowhere, and deleting it failed (%v): delete it and its key",
			e.Err, u.c.Mount, is.ID, derr)
		return e
	}
	e.Err = fmt.Errorf("%w; the new issuer %s/issuer/%s and its key were deleted", e.Err, u.c.Mount, is.ID)
	return e
}
