package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer/cfssl"
	"github.com/meshca/meshca/signer/vault"
	"github.com/spf13/pflag"
)

// rootBackend is the signer's side of a rotation step. The built-in CA
// has none: its keys are in the CA state. Vault holds its keys in issuers
// of its PKI mount, which the steps create, switch and delete; a cfssl
// server's key is changed by its operator, and meshca checks the change.
// Each method runs before the CA state records the step, so that a crash
// in between leaves a state the same step, run again, completes.
type rootBackend interface {
	// prepare creates the authority to add, or returns nil to let the
	// flags build it.
	prepare(ctx context.Context, s *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error)
	// activate makes rec, an authority of s, sign.
	activate(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error
	// retire destroys rec's key, or says who must; what another authority
	// of s that is not retired still uses is kept.
	retire(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error
}

// Vault issuer kinds `meshca root prepare --signer vault` creates.
const (
	vaultIssuerRoot         = "root"
	vaultIssuerIntermediate = "intermediate"
)

// rootSignerFlags select the signer whose keys a rotation step changes.
type rootSignerFlags struct {
	signer     string
	vault      vaultFlags
	issuerType string
	rootMount  string
	keepIssuer bool
	cfsslURL   string
	cfsslTLSCA string
	cfsslLabel string
	cfsslProf  string
	out        io.Writer
}

// register registers the signer flags that apply to step: prepare,
// activate or retire.
func (r *rootSignerFlags) register(fl *pflag.FlagSet, step string) {
	fl.StringVar(&r.signer, "signer", signerLocal, "whose keys the step changes: local (built-in CA, keys in the CA state), vault (issuers of its PKI mount) or cfssl (a server whose key its operator changes)")
	r.vault.registerLogin(fl)
	r.issuerType = vaultIssuerRoot
	switch step {
	case "prepare":
		fl.StringVar(&r.issuerType, "vault-issuer-type", vaultIssuerRoot, "--signer vault: a new root issuer in --vault-pki-mount, or an intermediate there under a new root in --vault-root-mount")
		fl.StringVar(&r.rootMount, "vault-root-mount", "", "--signer vault: the PKI mount holding the roots of intermediate issuers")
	case "activate":
		r.vault.registerRoles(fl)
		fl.StringVar(&r.cfsslURL, "cfssl-url", "", "--signer cfssl: the cfssl server, checked to sign with the new authority's key")
		fl.StringVar(&r.cfsslTLSCA, "cfssl-tls-ca-file", "", "PEM roots verifying an https cfssl server")
		fl.StringVar(&r.cfsslLabel, "cfssl-label", "", "cfssl signer label (multirootca)")
		fl.StringVar(&r.cfsslProf, "cfssl-profile", "", "cfssl signing profile whose signer is checked")
	case "retire":
		fl.StringVar(&r.rootMount, "vault-root-mount", "", "--signer vault: the PKI mount holding the roots of intermediate issuers")
		fl.BoolVar(&r.keepIssuer, "vault-keep-issuer", false, "--signer vault: keep the retired issuer and its key in Vault (default: delete them)")
	}
}

// backend returns the rotation side of the selected signer.
func (r *rootSignerFlags) backend(ctx context.Context) (rootBackend, error) {
	switch r.signer {
	case signerLocal:
		return localRoot{}, nil
	case signerCfssl:
		return &cfsslRoot{flags: r}, nil
	case signerVault:
	default:
		return nil, fmt.Errorf("--signer %q is not one of local, cfssl, vault", r.signer)
	}
	switch {
	case r.issuerType != vaultIssuerRoot && r.issuerType != vaultIssuerIntermediate:
		return nil, fmt.Errorf("--vault-issuer-type %q is not one of root, intermediate", r.issuerType)
	case r.issuerType == vaultIssuerIntermediate && (r.rootMount == "" || r.rootMount == r.vault.mount):
		return nil, errors.New("--vault-issuer-type intermediate needs --vault-root-mount, a PKI mount other than --vault-pki-mount, for the new root")
	case r.vault.addr == "":
		return nil, errors.New("--vault-addr is required with --signer vault")
	}
	if err := r.vault.validateLogin(); err != nil {
		return nil, err
	}
	auth, err := r.vault.auth()
	if err != nil {
		return nil, err
	}
	is, err := vault.NewIssuers(ctx, vault.Config{Address: r.vault.addr, CACertFile: r.vault.caFile, Mount: r.vault.mount, Auth: auth})
	if err != nil {
		return nil, err
	}
	return &vaultRoot{flags: r, issuers: is}, nil
}

// localRoot is the built-in CA: every step is the CA state's alone.
type localRoot struct{}

func (localRoot) prepare(context.Context, *keymgr.State, *prepareFlags) (*keymgr.AuthorityRecord, error) {
	return nil, nil
}
func (localRoot) activate(context.Context, *keymgr.State, *keymgr.AuthorityRecord) error { return nil }
func (localRoot) retire(context.Context, *keymgr.State, *keymgr.AuthorityRecord) error   { return nil }

// vaultRoot drives the issuers of a Vault PKI mount.
type vaultRoot struct {
	flags   *rootSignerFlags
	issuers *vault.Issuers
}

func (v *vaultRoot) prepare(ctx context.Context, s *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error) {
	if f.certFile != "" || f.caDir != "" || f.external {
		return nil, errors.New("--signer vault creates its issuer in Vault: import flags (--cert, --ca-dir, --external) do not apply")
	}
	org := f.organization(s)
	now := time.Now().UTC()
	// Vault refuses a name twice: the time, and a random tail for two
	// prepares in one second.
	stamp := now.Format("20060102T150405Z") + "-" + rand.Text()[:6]
	root := vault.IssuerSpec{CommonName: "meshca root " + now.Format(time.RFC3339), Organization: org,
		KeyType: keymgr.KeyType(f.keyType), TTL: f.lifetime, Name: "meshca-root-" + stamp}
	if v.flags.issuerType == vaultIssuerRoot {
		cert, err := v.issuers.CreateRoot(ctx, root)
		if err != nil {
			return nil, err
		}
		return &keymgr.AuthorityRecord{Root: cert, Cert: cert, External: true}, nil
	}
	inter := vault.IssuerSpec{CommonName: "meshca intermediate " + now.Format(time.RFC3339), Organization: org,
		KeyType: keymgr.KeyType(f.keyType), TTL: f.lifetime - time.Hour, Name: "meshca-intermediate-" + stamp}
	rootCert, cert, err := v.issuers.CreateIntermediate(ctx, v.flags.rootMount, root, inter)
	if err != nil {
		return nil, err
	}
	return &keymgr.AuthorityRecord{Root: rootCert, Cert: cert, External: true}, nil
}

func (v *vaultRoot) activate(ctx context.Context, _ *keymgr.State, rec *keymgr.AuthorityRecord) error {
	var roles []string
	for _, r := range []string{v.flags.vault.role, v.flags.vault.rsaRole} {
		if r != "" {
			roles = append(roles, r)
		}
	}
	return v.issuers.Activate(ctx, rec.Cert, roles)
}

func (v *vaultRoot) retire(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if v.flags.keepIssuer {
		fmt.Fprintf(v.flags.out, "kept in Vault: the issuers of %s (--vault-keep-issuer)\n", shortID(rec))
		return nil
	}
	var certs []*x509.Certificate
	for _, c := range append([]*x509.Certificate{rec.Cert, rec.Root}, rec.Chain...) {
		if by := s.InUseBy(rec, c); by != nil {
			fmt.Fprintf(v.flags.out, "kept in Vault: %q and its key, which authority %s (%s) still uses\n", c.Subject, shortID(by), by.Phase)
			continue
		}
		certs = append(certs, c)
	}
	deleted, err := v.issuers.Delete(ctx, v.flags.rootMount, certs...)
	for _, d := range deleted {
		fmt.Fprintf(v.flags.out, "deleted in Vault: %s and its key\n", d)
	}
	return err
}

// cfsslRoot: meshca manages the trust bundle around a key change that the
// cfssl server's operator makes.
type cfsslRoot struct{ flags *rootSignerFlags }

func (c *cfsslRoot) prepare(_ context.Context, _ *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error) {
	if f.certFile == "" || f.keyFile != "" || f.caDir != "" {
		return nil, errors.New("--signer cfssl: give the new root (or intermediate with --root and --chain) with --cert alone: its key belongs to the cfssl server")
	}
	f.external = f.rootFile == "" && f.chainFile == ""
	if f.external {
		return nil, nil
	}
	cert, err := readOne("--cert", f.certFile)
	if err != nil {
		return nil, err
	}
	rec := &keymgr.AuthorityRecord{Cert: cert, External: true}
	if rec.Root, err = readOne("--root", f.rootFile); err != nil {
		return nil, err
	}
	if f.chainFile != "" {
		if rec.Chain, err = readCerts("--chain", f.chainFile); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

// activate checks, when the server is named, that it already signs with
// the authority's key: the operator changes it once the guard allows.
func (c *cfsslRoot) activate(ctx context.Context, _ *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if c.flags.cfsslURL == "" {
		fmt.Fprintln(c.flags.out, "not checked: whether cfssl signs with the new key (give --cfssl-url to check)")
		return nil
	}
	rc := cfssl.RemoteConfig{URL: c.flags.cfsslURL, Label: c.flags.cfsslLabel, Profile: c.flags.cfsslProf}
	if c.flags.cfsslTLSCA != "" {
		roots, err := readCerts("--cfssl-tls-ca-file", c.flags.cfsslTLSCA)
		if err != nil {
			return err
		}
		rc.TLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: keymgr.Pool(roots...)}
	}
	got, err := cfssl.RemoteIssuer(ctx, rc)
	if err != nil {
		return err
	}
	if !got.Equal(rec.Cert) {
		return &exitError{code: exitRefused, err: fmt.Errorf("cfssl at %s signs with %q, not with the authority to activate (%q): switch the server to the new key (docs/rotation.md), then activate",
			c.flags.cfsslURL, got.Subject, rec.Cert.Subject)}
	}
	return nil
}

func (c *cfsslRoot) retire(_ context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error {
	if by := s.InUseBy(rec, rec.Cert); by != nil {
		fmt.Fprintf(c.flags.out, "keep the key of %q: authority %s (%s) still uses it\n", strings.TrimSpace(rec.Cert.Subject.String()), shortID(by), by.Phase)
		return nil
	}
	fmt.Fprintf(c.flags.out, "to do by the cfssl operator: destroy the key of %q, which no longer signs\n",
		strings.TrimSpace(rec.Cert.Subject.String()))
	return nil
}
