package vaultpki

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"

	"github.com/meshca/meshca/keymgr/upstream"
)

var _ upstream.CRLSource = (*Upstream)(nil)

// maxCRLBytes bounds a CRL read from Vault.
const maxCRLBytes = 16 << 20

// CRL implements upstream.CRLSource: the CRL of the issuer ref.Key names
// (<mount>/issuer/<id>/crl/der, read without a policy), after asking
// Vault to rebuild the mount's CRLs (<mount>/crl/rotate) once half its
// validity has passed. It must be issuer's.
func (u *Upstream) CRL(ctx context.Context, issuer *x509.Certificate, ref upstream.Ref) ([]byte, error) {
	if ref.Type != Name || ref.Key == "" {
		return nil, errorf(upstream.KindRefused, "the CRL of %q is kept by %q, not by a Vault PKI issuer", issuer.Subject, ref.Type)
	}
	id, err := u.issuerID(ctx, issuer, ref.Key)
	if err != nil {
		return nil, err
	}
	der, l, err := u.readCRL(ctx, issuer, id)
	if err != nil {
		return nil, err
	}
	if u.c.Now().Before(l.ThisUpdate.Add(l.NextUpdate.Sub(l.ThisUpdate) / 2)) {
		return der, nil
	}
	if _, err := u.sess.Read(ctx, u.c.Mount+"/crl/rotate"); err != nil {
		return nil, upstreamError(err)
	}
	der, _, err = u.readCRL(ctx, issuer, id)
	return der, err
}

// issuerID is the ID of the mount's issuer whose certificate is cert: the
// one ref names (the issuer that signs meshca's intermediates), or,
// for a CA above it (the root over a Vault intermediate), the one found
// by its certificate.
func (u *Upstream) issuerID(ctx context.Context, cert *x509.Certificate, ref string) (string, error) {
	if c, err := u.issuer(ctx, ref); err == nil && c.Equal(cert) {
		return ref, nil
	}
	is, err := (&Issuers{client: u.sess.Client(), mount: u.c.Mount}).find(ctx, u.c.Mount, cert)
	if err != nil {
		return "", errorf(upstream.KindRefused, "the CRL of %q: %v", cert.Subject, err)
	}
	return is.ID, nil
}

// readCRL reads and checks the CRL of issuer id.
func (u *Upstream) readCRL(ctx context.Context, issuer *x509.Certificate, id string) ([]byte, *x509.RevocationList, error) {
	path := u.c.Mount + "/issuer/" + id + "/crl/der"
	resp, err := u.sess.Client().Logical().ReadRawWithContext(ctx, path)
	if err != nil {
		return nil, nil, upstreamError(err)
	}
	defer resp.Body.Close()
	der, err := io.ReadAll(io.LimitReader(resp.Body, maxCRLBytes+1))
	switch {
	case err != nil:
		return nil, nil, errorf(upstream.KindUnavailable, "%s: %v", path, err)
	case len(der) > maxCRLBytes:
		return nil, nil, errorf(upstream.KindInternal, "%s: larger than %d bytes", path, maxCRLBytes)
	}
	l, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, nil, errorf(upstream.KindInternal, "%s: %v", path, err)
	}
	if err := l.CheckSignatureFrom(issuer); err != nil {
		return nil, nil, errorf(upstream.KindRefused, "%s is not signed by %q, the issuer the CA state names: %v", path, issuer.Subject, err)
	}
	return der, l, nil
}

// Revoke implements upstream.CRLSource with <mount>/revoke, by the
// certificate (which Vault checks an issuer of the mount signed).
func (u *Upstream) Revoke(ctx context.Context, cert *x509.Certificate, ref upstream.Ref) error {
	if ref.Type != Name {
		return errorf(upstream.KindRefused, "%q is revoked where %q keeps its issuer's key, not in Vault PKI", cert.Subject, ref.Type)
	}
	data := map[string]any{"certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))}
	if _, err := u.sess.Write(ctx, u.c.Mount+"/revoke", data); err != nil {
		return fmt.Errorf("revoke %q in Vault: %w", cert.Subject, upstreamError(err))
	}
	return nil
}
