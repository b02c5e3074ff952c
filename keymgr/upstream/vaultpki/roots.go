package vaultpki

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/upstream"
)

// Roots are the self-signed certificates of the mount's issuers, each
// once: the trust bundle of a mesh whose intermediates Vault signs.
// Listing issuers and reading their certificates need no policy.
func (u *Upstream) Roots(ctx context.Context) ([]*x509.Certificate, error) {
	list := u.c.Mount + "/issuers"
	secret, err := u.sess.Do(ctx, list, func(ctx context.Context, l *api.Logical) (*api.Secret, error) {
		return l.ListWithContext(ctx, list)
	})
	if err != nil {
		return nil, upstreamError(err)
	}
	var ids []any
	if secret != nil && secret.Data != nil {
		ids, _ = secret.Data["keys"].([]any)
	}
	var roots []*x509.Certificate
	for _, v := range ids {
		id, _ := v.(string)
		path := u.c.Mount + "/issuer/" + id + "/json"
		s, err := u.sess.Read(ctx, path)
		if err != nil {
			return nil, upstreamError(err)
		}
		cert, err := certificateOf(s, "certificate")
		if err != nil {
			return nil, errorf(upstream.KindInternal, "%s: %v", path, err)
		}
		if certs.IsSelfSigned(cert) && !containsCert(roots, cert) {
			roots = append(roots, cert)
		}
	}
	if len(roots) == 0 {
		return nil, errorf(upstream.KindRefused, "%s has no root issuer: import the root of meshca's issuer into the mount (docs/upstream.md)", list)
	}
	return roots, nil
}

// NewRoot makes the root of a new lineage for `meshca root prepare`: a
// new root issuer in the mount (root/generate/internal, its key made in
// Vault and never exported) named meshca-root-<time>, or, with
// Config.Issuer, that existing issuer (it must hold its key; the root is
// the self-signed end of its chain). Root.Ref names the issuer by its ID,
// which a rename does not change.
func (u *Upstream) NewRoot(ctx context.Context, req *upstream.RootRequest) (*upstream.Root, error) {
	if _, err := u.sess.Current(ctx); err != nil {
		return nil, upstreamError(err)
	}
	if u.c.Issuer != "" {
		return u.adopt(ctx)
	}
	now := req.Now
	if now.IsZero() {
		now = u.c.Now()
	}
	now = now.UTC()
	spec := IssuerSpec{
		CommonName: req.Subject.CommonName, KeyType: req.KeyType, TTL: req.TTL,
		// Vault refuses a name twice: the time, and a random tail for two
		// prepares in one second.
		Name: "meshca-root-" + now.Format("20060102T150405Z") + "-" + strings.ToLower(rand.Text()[:6]),
	}
	if spec.CommonName == "" {
		spec.CommonName = "meshca root " + now.Format("2006-01-02T15:04:05Z")
	}
	if len(req.Subject.Organization) > 0 {
		spec.Organization = req.Subject.Organization[0]
	}
	is, err := createRoot(ctx, u.sess.Client(), u.c.Mount, spec)
	if err != nil {
		// Made, then not set up (truncateLeaves): recorded nowhere.
		return nil, u.orphan(ctx, is, err)
	}
	return &upstream.Root{Cert: is.Cert, Ref: upstream.Ref{Type: Name, Key: is.ID}}, nil
}

// adopt takes Config.Issuer as the root of a new lineage.
func (u *Upstream) adopt(ctx context.Context) (*upstream.Root, error) {
	path := u.c.Mount + "/issuer/" + u.c.Issuer
	s, err := u.sess.Read(ctx, path)
	switch {
	case err != nil:
		return nil, upstreamError(err)
	case s == nil:
		return nil, errorf(upstream.KindRefused, "%s: no such issuer", path)
	}
	id, _ := dataString(s, "issuer_id")
	if key, _ := dataString(s, "key_id"); key == "" || id == "" {
		return nil, errorf(upstream.KindRefused, "%s has no key in Vault: it cannot sign", path)
	}
	chain, err := chainOf(s)
	if err != nil {
		return nil, errorf(upstream.KindInternal, "%s: ca_chain: %v", path, err)
	}
	for _, c := range chain {
		if certs.IsSelfSigned(c) {
			return &upstream.Root{Cert: c, Ref: upstream.Ref{Type: Name, Key: id}, Adopted: true}, nil
		}
	}
	return nil, errorf(upstream.KindRefused, "%s does not chain to a root in %s: import its root into the mount (%s/issuers/import/cert) so that meshca can publish it", path, u.c.Mount, u.c.Mount)
}

// String names the upstream and its mount, for logs.
func (u *Upstream) String() string { return fmt.Sprintf("%s (%s)", Name, u.c.Mount) }
