package vaulttransit

import (
	"context"
	"crypto/x509"
	"strings"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/csr"
	"github.com/meshca/meshca/keymgr/upstream"
)

var _ upstream.KeyDestroyer = (*Upstream)(nil)

// madePrefix starts the name of every Transit key meshca makes by
// itself; a key of another name was named by an operator
// (--vault-transit-key), and is theirs to delete.
const madePrefix = "meshca-root-"

// NewRoot makes the root of a new lineage (upstream.KeySigned's), adopted
// when Config.Key named its key: meshca never destroys such a key.
func (u *Upstream) NewRoot(ctx context.Context, req *upstream.RootRequest) (*upstream.Root, error) {
	r, err := u.KeySigned.NewRoot(ctx, req)
	if r != nil {
		r.Adopted = u.c.Key != ""
	}
	return r, err
}

// CheckDestroy reports whether DestroyRoot would delete the Transit key
// ref names: a key meshca made (meshca-root-...), root's at the version
// the Ref names, whose deletion_allowed an operator has set. meshca never
// sets it: its policies cannot configure a key, which is what keeps a
// key from being made exportable.
func (u *Upstream) CheckDestroy(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	_, err := u.destroyable(ctx, root, ref)
	return err
}

// DestroyRoot deletes the Transit key ref names, every version of it.
func (u *Upstream) DestroyRoot(ctx context.Context, root *x509.Certificate, ref upstream.Ref) error {
	k, err := u.destroyable(ctx, root, ref)
	if err != nil {
		return err
	}
	path := u.c.Mount + "/keys/" + k.name
	if _, err := u.sess.Do(ctx, path, func(ctx context.Context, l *api.Logical) (*api.Secret, error) { return l.DeleteWithContext(ctx, path) }); err != nil {
		return upstreamError(err)
	}
	return nil
}

// destroyable is the key ref names, when DestroyRoot may delete it.
func (u *Upstream) destroyable(ctx context.Context, root *x509.Certificate, ref upstream.Ref) (keyRef, error) {
	if ref.Type != Name {
		return keyRef{}, errorf(upstream.KindRefused, "root %q is kept by %q, not in Vault Transit", root.Subject, ref.Type)
	}
	k, err := parseKeyRef(ref.Key)
	if err != nil {
		return keyRef{}, errorf(upstream.KindRefused, "root %q: %v", root.Subject, err)
	}
	path := u.c.Mount + "/keys/" + k.name
	if !strings.HasPrefix(k.name, madePrefix) {
		return keyRef{}, errorf(upstream.KindRefused, "%s was named by an operator (--vault-transit-key), not made by meshca: its owner deletes it", path)
	}
	s, err := u.keySigner(ctx, k)
	if err != nil {
		return keyRef{}, err
	}
	if !csr.SamePublicKey(s.Public(), root.PublicKey) {
		return keyRef{}, errorf(upstream.KindRefused, "%s version %d is not the key of root %q", path, k.version, root.Subject)
	}
	t, err := u.readKey(ctx, k.name)
	if err != nil {
		return keyRef{}, err
	}
	if t == nil || !t.DeletionAllowed {
		return keyRef{}, errorf(upstream.KindRefused, "%s cannot be deleted: its deletion_allowed is false, and meshca never sets it "+
			"(its policies cannot configure a key); a Vault operator runs `vault write %s/config deletion_allowed=true`, "+
			"then `vault delete %s` (or, for a root being retired, meshca root retire --destroy-root-key)", path, path, path)
	}
	return k, nil
}

// destroyOrphan deletes the key of a NewRoot that failed after making it,
// as DestroyRoot would; a key Config.Key named is never deleted.
func (u *Upstream) destroyOrphan(ctx context.Context, ref upstream.Ref) error {
	if u.c.Key != "" {
		return errorf(upstream.KindRefused, "%s/keys/%s was named by --vault-transit-key: meshca leaves it", u.c.Mount, u.c.Key)
	}
	k, err := parseKeyRef(ref.Key)
	if err != nil {
		return errorf(upstream.KindRefused, "%v", err)
	}
	s, err := u.keySigner(ctx, k)
	if err != nil {
		return err
	}
	return u.DestroyRoot(ctx, &x509.Certificate{PublicKey: s.Public()}, ref)
}
