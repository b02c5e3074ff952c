package vault

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/meshca/meshca/signer"
)

var _ signer.Revoker = (*Signer)(nil)

// Revoke implements signer.Revoker with <mount>/revoke (logging in
// first when not yet logged in): by the
// certificate when r has it (a role with no_store, as docs/signers/vault.md
// configures them, keeps no serials), else by its serial number.
func (s *Signer) Revoke(ctx context.Context, r signer.Revocation) error {
	data := map[string]any{}
	switch {
	case r.Cert != nil:
		data["certificate"] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Cert.Raw}))
	case r.Serial != nil && r.Serial.Sign() > 0:
		data["serial_number"] = vaultSerial(r.Serial.Bytes())
	default:
		return &signer.Error{Backend: name, Kind: signer.KindInternal, Err: errors.New("revoke: neither a certificate nor a positive serial number")}
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.Timeout)
	defer cancel()
	if _, err := s.sess.Current(ctx); err != nil {
		return signerError(err)
	}
	if _, err := s.client.Logical().WriteWithContext(ctx, s.c.Mount+"/revoke", data); err != nil {
		switch {
		case r.Cert == nil && strings.Contains(err.Error(), "not found"):
			return &signer.Error{Backend: name, Kind: signer.KindRefused,
				Err: fmt.Errorf("%w (a role with no_store keeps no serials: revoke with the certificate)", err)}
		case r.Cert != nil && strings.Contains(err.Error(), "unable to verify signature"):
			// Vault answers 500, though nothing is down: no issuer of
			// the mount signed it.
			return &signer.Error{Backend: name, Kind: signer.KindRefused,
				Err: fmt.Errorf("no issuer of %s signed %q: %w", s.c.Mount, r.Cert.Subject, err)}
		}
		return signerError(err)
	}
	return nil
}

// vaultSerial writes serial's bytes as Vault names serials: hex octets
// joined by colons.
func vaultSerial(b []byte) string {
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

// CRLs implements signer.Revoker: the CRL of each issuer of the mount
// (<mount>/issuer/<id>/crl/der), each once (issuers that share a key
// share one); when one has passed half its validity, Vault is asked to
// rebuild them (<mount>/crl/rotate) first.
func (s *Signer) CRLs(ctx context.Context) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.c.Timeout)
	defer cancel()
	if _, err := s.sess.Current(ctx); err != nil {
		return nil, signerError(err)
	}
	crls, stale, err := s.readCRLs(ctx)
	if err != nil || !stale {
		return crls, err
	}
	if _, err := s.client.Logical().ReadWithContext(ctx, s.c.Mount+"/crl/rotate"); err != nil {
		return nil, signerError(err)
	}
	crls, _, err = s.readCRLs(ctx)
	return crls, err
}

// readCRLs reads every issuer's CRL, and reports whether one has passed
// half its validity.
func (s *Signer) readCRLs(ctx context.Context) ([][]byte, bool, error) {
	list, err := s.client.Logical().ListWithContext(ctx, s.c.Mount+"/issuers")
	if err != nil {
		return nil, false, signerError(err)
	}
	var ids []string
	if list != nil {
		if keys, ok := list.Data["keys"].([]any); ok {
			for _, k := range keys {
				if id, ok := k.(string); ok {
					ids = append(ids, id)
				}
			}
		}
	}
	if len(ids) == 0 {
		return nil, false, &signer.Error{Backend: name, Kind: signer.KindRefused, Err: fmt.Errorf("%s has no issuer", s.c.Mount)}
	}
	var out [][]byte
	stale := false
	now := s.c.Now()
	for _, id := range ids {
		der, err := s.readCRL(ctx, id)
		if err != nil {
			return nil, false, err
		}
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			return nil, false, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: fmt.Errorf("the CRL of issuer %s does not parse: %w", id, err)}
		}
		if !now.Before(l.ThisUpdate.Add(l.NextUpdate.Sub(l.ThisUpdate) / 2)) {
			stale = true
		}
		if !slices.ContainsFunc(out, func(o []byte) bool { return string(o) == string(der) }) {
			out = append(out, der)
		}
	}
	return out, stale, nil
}

// readCRL reads the DER CRL of issuer id.
func (s *Signer) readCRL(ctx context.Context, id string) ([]byte, error) {
	resp, err := s.client.Logical().ReadRawWithContext(ctx, s.c.Mount+"/issuer/"+id+"/crl/der")
	if err != nil {
		return nil, signerError(err)
	}
	defer resp.Body.Close()
	der, err := io.ReadAll(io.LimitReader(resp.Body, maxCRLBytes+1))
	switch {
	case err != nil:
		return nil, &signer.Error{Backend: name, Kind: signer.KindUnavailable, Err: fmt.Errorf("read the CRL of issuer %s: %w", id, err)}
	case len(der) > maxCRLBytes:
		return nil, &signer.Error{Backend: name, Kind: signer.KindInternal, Err: fmt.Errorf("the CRL of issuer %s is larger than %d bytes", id, maxCRLBytes)}
	}
	return der, nil
}

// maxCRLBytes bounds a CRL read from Vault.
const maxCRLBytes = 16 << 20
