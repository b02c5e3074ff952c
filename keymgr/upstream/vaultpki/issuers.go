package vaultpki

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/vaultauth"
)

// Issuers manages the issuers of a PKI mount, Vault's side of the
// `meshca root` steps: prepare creates an issuer (a new root, or a new
// root in another mount with a new intermediate under it), activate makes
// it the one Vault signs with, retire deletes it and its key. meshca's CA
// state stays the record of which roots are trusted; an issuer is found
// by its certificate, so nothing in Vault needs to be named by meshca.
type Issuers struct {
	client *api.Client
	mount  string
}

// IssuerSpec describes a CA certificate Vault generates.
type IssuerSpec struct {
	CommonName   string
	Organization string
	KeyType      certs.KeyType
	TTL          time.Duration
	// Name is the issuer's (and its key's) name in Vault.
	Name string
}

// NewIssuers returns the issuers of mount ("pki" when empty), managed
// with client, which holds a token (vaultauth.Login).
func NewIssuers(client *api.Client, mount string) *Issuers {
	if mount == "" {
		mount = "pki"
	}
	return &Issuers{client: client, mount: mount}
}

// keyParams are Vault's key_type and key_bits for t.
func keyParams(t certs.KeyType) (string, int, error) {
	switch t {
	case certs.KeyECP256:
		return "ec", 256, nil
	case certs.KeyECP384:
		return "ec", 384, nil
	case certs.KeyRSA2048:
		return "rsa", 2048, nil
	case certs.KeyRSA3072:
		return "rsa", 3072, nil
	case certs.KeyRSA4096:
		return "rsa", 4096, nil
	}
	return "", 0, fmt.Errorf("vault: unknown key type %q (want one of %v)", t, certs.KeyTypes)
}

func (s IssuerSpec) params() (map[string]any, error) {
	kt, bits, err := keyParams(s.KeyType)
	if err != nil {
		return nil, err
	}
	p := map[string]any{"common_name": s.CommonName, "key_type": kt, "key_bits": bits}
	if s.Organization != "" {
		p["organization"] = s.Organization
	}
	if s.TTL > 0 {
		p["ttl"] = fmt.Sprintf("%ds", int64(s.TTL/time.Second))
	}
	if s.Name != "" {
		p["issuer_name"], p["key_name"] = s.Name, s.Name
	}
	return p, nil
}

// CreateRoot generates a root issuer in the mount, with a key that never
// leaves Vault. It does not become the default issuer.
func (i *Issuers) CreateRoot(ctx context.Context, spec IssuerSpec) (*x509.Certificate, error) {
	is, err := createRoot(ctx, i.client, i.mount, spec)
	return is.Cert, err
}

// createRoot generates a root issuer in mount and returns it (its Cert
// and ID; KeyID and Name are left empty).
func createRoot(ctx context.Context, client *api.Client, mount string, spec IssuerSpec) (Issuer, error) {
	p, err := spec.params()
	if err != nil {
		return Issuer{}, err
	}
	secret, err := client.Logical().WriteWithContext(ctx, mount+"/root/generate/internal", p)
	if err != nil {
		return Issuer{}, fmt.Errorf("vault: %s/root/generate/internal: %w", mount, err)
	}
	cert, err := certificateOf(secret, "certificate")
	if err != nil {
		return Issuer{}, fmt.Errorf("vault: %s/root/generate/internal: %w", mount, err)
	}
	id, _ := secret.Data["issuer_id"].(string)
	return Issuer{ID: id, Cert: cert}, truncateLeaves(ctx, client, mount, id)
}

// CreateIntermediate generates a new root in rootMount and, in the mount,
// an intermediate under it (its CSR signed by the new root, then imported
// with set-signed). It returns both; neither becomes a default issuer.
func (i *Issuers) CreateIntermediate(ctx context.Context, rootMount string, root, inter IssuerSpec) (*x509.Certificate, *x509.Certificate, error) {
	if rootMount == "" || rootMount == i.mount {
		return nil, nil, fmt.Errorf("vault: the root of an intermediate needs a mount of its own, not %q", rootMount)
	}
	rootIssuer, err := createRoot(ctx, i.client, rootMount, root)
	if err != nil {
		return nil, nil, err
	}
	rootCert := rootIssuer.Cert
	p, err := inter.params()
	if err != nil {
		return nil, nil, err
	}
	delete(p, "issuer_name") // generate names only the key; set-signed creates the issuer
	gen, err := i.client.Logical().WriteWithContext(ctx, i.mount+"/intermediate/generate/internal", p)
	if err != nil {
		return nil, nil, fmt.Errorf("vault: %s/intermediate/generate/internal: %w", i.mount, err)
	}
	csrPEM, _ := dataString(gen, "csr")
	rootID, err := i.find(ctx, rootMount, rootCert)
	if err != nil {
		return nil, nil, err
	}
	sp := map[string]any{"csr": csrPEM, "common_name": inter.CommonName, "use_csr_values": true}
	if inter.TTL > 0 {
		sp["ttl"] = fmt.Sprintf("%ds", int64(inter.TTL/time.Second))
	}
	signed, err := i.client.Logical().WriteWithContext(ctx, rootMount+"/issuer/"+rootID.ID+"/sign-intermediate", sp)
	if err != nil {
		return nil, nil, fmt.Errorf("vault: %s/issuer/%s/sign-intermediate: %w", rootMount, rootID.ID, err)
	}
	cert, err := certificateOf(signed, "certificate")
	if err != nil {
		return nil, nil, err
	}
	body := string(pemutil.EncodeCertificates(cert, rootCert))
	if _, err := i.client.Logical().WriteWithContext(ctx, i.mount+"/intermediate/set-signed", map[string]any{"certificate": body}); err != nil {
		return nil, nil, fmt.Errorf("vault: %s/intermediate/set-signed: %w", i.mount, err)
	}
	ref, err := i.find(ctx, i.mount, cert)
	if err != nil {
		return nil, nil, err
	}
	if inter.Name != "" {
		if _, err := i.client.Logical().JSONMergePatch(ctx, i.mount+"/issuer/"+ref.ID, map[string]any{"issuer_name": inter.Name}); err != nil {
			return nil, nil, fmt.Errorf("vault: naming issuer %s: %w", ref.ID, err)
		}
	}
	return rootCert, cert, truncateLeaves(ctx, i.client, i.mount, ref.ID)
}

// truncateLeaves makes the issuer cut a leaf's lifetime at its own expiry
// instead of refusing to sign (Vault's default), as meshca's other
// backends do; meshca checks the result either way.
func truncateLeaves(ctx context.Context, client *api.Client, mount, id string) error {
	if id == "" {
		return nil
	}
	if _, err := client.Logical().JSONMergePatch(ctx, mount+"/issuer/"+id, map[string]any{"leaf_not_after_behavior": "truncate"}); err != nil {
		return fmt.Errorf("vault: issuer %s settings: %w", id, err)
	}
	return nil
}

// Issuer is one issuer of a mount.
type Issuer struct {
	ID, Name, KeyID string
	Cert            *x509.Certificate
}

// List returns the mount's issuers.
func (i *Issuers) List(ctx context.Context) ([]Issuer, error) { return list(ctx, i.client, i.mount) }

func list(ctx context.Context, client *api.Client, mount string) ([]Issuer, error) {
	secret, err := client.Logical().ListWithContext(ctx, mount+"/issuers")
	if err != nil {
		return nil, fmt.Errorf("vault: listing %s/issuers: %w", mount, err)
	}
	var ids []any
	if secret != nil && secret.Data != nil {
		ids, _ = secret.Data["keys"].([]any)
	}
	out := make([]Issuer, 0, len(ids))
	for _, v := range ids {
		id, _ := v.(string)
		s, err := client.Logical().ReadWithContext(ctx, mount+"/issuer/"+id)
		if err != nil {
			return nil, fmt.Errorf("vault: reading %s/issuer/%s: %w", mount, id, err)
		}
		cert, err := certificateOf(s, "certificate")
		if err != nil {
			return nil, fmt.Errorf("vault: %s/issuer/%s: %w", mount, id, err)
		}
		name, _ := dataString(s, "issuer_name")
		key, _ := dataString(s, "key_id")
		out = append(out, Issuer{ID: id, Name: name, KeyID: key, Cert: cert})
	}
	return out, nil
}

// ErrNoIssuer: no issuer of the mount has the certificate.
var ErrNoIssuer = errors.New("vault: no issuer has this certificate")

func (i *Issuers) find(ctx context.Context, mount string, cert *x509.Certificate) (Issuer, error) {
	all, err := list(ctx, i.client, mount)
	if err != nil {
		return Issuer{}, err
	}
	for _, is := range all {
		if is.Cert.Equal(cert) && (is.KeyID != "" || len(all) == 1) {
			return is, nil
		}
	}
	for _, is := range all {
		if is.Cert.Equal(cert) {
			return is, nil
		}
	}
	return Issuer{}, fmt.Errorf("%w in %s (subject %q)", ErrNoIssuer, mount, cert.Subject)
}

// Activate makes the issuer of cert sign: it becomes the mount's default
// issuer, and every role of roles whose issuer_ref names an issuer
// explicitly is pointed at it. Idempotent.
func (i *Issuers) Activate(ctx context.Context, cert *x509.Certificate, roles []string) error {
	is, err := i.find(ctx, i.mount, cert)
	if err != nil {
		return err
	}
	if is.KeyID == "" {
		return fmt.Errorf("vault: issuer %s in %s has no key in Vault: it cannot sign", is.ID, i.mount)
	}
	if _, err := i.client.Logical().WriteWithContext(ctx, i.mount+"/config/issuers",
		map[string]any{"default": is.ID, "default_follows_latest_issuer": false}); err != nil {
		return fmt.Errorf("vault: %s/config/issuers: %w", i.mount, err)
	}
	for _, role := range roles {
		r, err := i.client.Logical().ReadWithContext(ctx, i.mount+"/roles/"+role)
		if err != nil {
			return fmt.Errorf("vault: reading role %s/roles/%s: %w", i.mount, role, err)
		}
		if ref, _ := dataString(r, "issuer_ref"); ref == "" || ref == "default" || ref == is.ID {
			continue // follows the default issuer
		}
		if _, err := i.client.Logical().JSONMergePatch(ctx, i.mount+"/roles/"+role, map[string]any{"issuer_ref": is.ID}); err != nil {
			return fmt.Errorf("vault: pointing role %s/roles/%s at issuer %s: %w", i.mount, role, is.ID, err)
		}
	}
	return nil
}

// Delete removes every issuer of the mount (and of rootMount, when set)
// whose certificate is one of certs, and the keys they held, so that
// nothing signs under a retired authority again. Issuers already gone
// are skipped; it returns the ids deleted.
func (i *Issuers) Delete(ctx context.Context, rootMount string, certs ...*x509.Certificate) ([]string, error) {
	var deleted []string
	for _, mount := range []string{i.mount, rootMount} {
		if mount == "" {
			continue
		}
		all, err := list(ctx, i.client, mount)
		if err != nil {
			return deleted, err
		}
		for _, is := range all {
			if !containsCert(certs, is.Cert) {
				continue
			}
			if _, err := i.client.Logical().DeleteWithContext(ctx, mount+"/issuer/"+is.ID); err != nil && !vaultauth.IsNotFound(err) {
				return deleted, fmt.Errorf("vault: deleting %s/issuer/%s: %w", mount, is.ID, err)
			}
			if is.KeyID != "" {
				if _, err := i.client.Logical().DeleteWithContext(ctx, mount+"/key/"+is.KeyID); err != nil && !vaultauth.IsNotFound(err) {
					return deleted, fmt.Errorf("vault: deleting %s/key/%s: %w", mount, is.KeyID, err)
				}
			}
			deleted = append(deleted, mount+"/issuer/"+is.ID)
		}
	}
	return deleted, nil
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

func dataString(s *api.Secret, key string) (string, bool) {
	if s == nil || s.Data == nil {
		return "", false
	}
	v, ok := s.Data[key].(string)
	return v, ok
}

func certificateOf(s *api.Secret, key string) (*x509.Certificate, error) {
	p, ok := dataString(s, key)
	if !ok || strings.TrimSpace(p) == "" {
		return nil, fmt.Errorf("the answer has no %s", key)
	}
	certs, err := pemutil.ParseCertificates([]byte(p))
	if err != nil || len(certs) == 0 {
		return nil, fmt.Errorf("the answer's %s: %v", key, err)
	}
	return certs[0], nil
}
