package keymgr

import (
	"context"
	"fmt"

	"github.com/meshca/meshca/keymgr/upstream"
)

// OrphanError is a root key NewAuthority made in an upstream that no CA
// state records and that could not be destroyed: an operator deletes it,
// by the name it gives.
type OrphanError struct {
	Ref upstream.Ref
	Err error
}

func (e *OrphanError) Error() string {
	return fmt.Sprintf("the new root key %s in upstream %s is recorded in no CA state and was not destroyed (%v): delete it there",
		e.Ref.Key, e.Ref.Type, e.Err)
}

func (e *OrphanError) Unwrap() error { return e.Err }

// Discard destroys the root key of rec, an authority NewAuthority made in
// this process that the CA state did not take (its compare-and-swap lost,
// its step refused, its first intermediate failed), so that no key is
// left in the upstream recorded nowhere. It does nothing for an adopted
// key, a key the state would have kept (self), or a record loaded from a
// state. destroyed says whether it destroyed a key; a key it cannot
// destroy is an *OrphanError that names it.
func (r *Renewer) Discard(ctx context.Context, rec *AuthorityRecord) (destroyed bool, err error) {
	if rec == nil || !rec.madeKey {
		return false, nil
	}
	d, ok := r.Upstream.(upstream.KeyDestroyer)
	if !ok {
		return false, &OrphanError{Ref: rec.Upstream, Err: fmt.Errorf("upstream %s destroys no keys", r.Name)}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upstream.OrphanTimeout)
	defer cancel()
	if err := d.DestroyRoot(dctx, rec.Root, rec.Upstream); err != nil {
		return false, &OrphanError{Ref: rec.Upstream, Err: err}
	}
	return true, nil
}
