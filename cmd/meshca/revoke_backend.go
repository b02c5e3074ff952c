package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/vault"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// revokeBackendFlags revoke in an external backend that keeps its own
// CRLs (Vault), by the certificate: Vault's meshca roles keep no serials
// (no_store), and meshca's audit log records serials, not certificates.
type revokeBackendFlags struct {
	signer string
	cert   string
	vault  vaultFlags
}

// newVaultRevoker opens Vault for meshca revoke; tests replace it.
var newVaultRevoker = vault.NewRevoker

func (b *revokeBackendFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&b.signer, "signer", signerLocal, "where to revoke: local (the CA state's CRLs, which meshca signs) or vault (Vault's PKI mount revokes, by --cert; "+
		"meshca serve --publish-crl publishes its CRLs); cfssl and k8scsr cannot revoke (docs/backends.md)")
	fl.StringVar(&b.cert, "cert", "", "--signer vault: a PEM file of the certificates to revoke (their CA certificates, as in a cert chain, are skipped), or - for standard input")
	b.vault.registerLogin(fl)
}

// local reports whether the built-in CA's state revokes.
func (b *revokeBackendFlags) local() bool { return b.signer == signerLocal }

// check refuses what the backend cannot do; f holds the other flags.
func (b *revokeBackendFlags) check(f *revokeFlags) error {
	if b.local() {
		if b.cert != "" {
			return errors.New("--cert revokes in Vault (--signer vault); the built-in CA revokes by --serial")
		}
		return nil
	}
	if signerNamed(b.signer) == nil {
		return fmt.Errorf("--signer %q is not one of %s", b.signer, signerNames(func(*signerBackend) bool { return true }))
	}
	if b.signer != signerVault {
		_, err := signer.RevokerOf(nil, b.signer)
		return &exitError{code: exitRefused, err: fmt.Errorf("%w (docs/backends.md)", err)}
	}
	switch {
	case f.undo:
		return &exitError{code: exitRefused, err: errors.New("--signer vault: Vault cannot take a revocation back; " +
			"the certificate stays on its CRL until it expires (docs/backends.md)")}
	case f.node != "":
		return errors.New("--signer vault: Vault revokes a certificate only when given it, and meshca's audit log records serials, not certificates: " +
			"revoke each of the node's certificates with --cert, or rotate Vault's issuer (meshca root) (docs/revocation.md)")
	case f.intermediate != "":
		return errors.New("--signer vault: Vault's issuers are revoked in Vault (pki/issuer/<ref>/revoke) or rotated away (meshca root); meshca revokes leaves there")
	case f.serial != "":
		return errors.New("--signer vault: Vault's meshca roles keep no serials (no_store): give the certificate, --cert FILE")
	case b.cert == "":
		return errors.New("--signer vault needs --cert, the certificates to revoke")
	case f.store.stateDir != "" || f.store.stateSecret != "":
		return errors.New("--signer vault revokes in Vault: --state-dir and --state-secret do not apply")
	}
	return b.vault.validateLogin()
}

// readCerts reads --cert: the certificates that are not CAs.
func (b *revokeBackendFlags) readCerts(stdin io.Reader) ([]*x509.Certificate, error) {
	var data []byte
	var err error
	if b.cert == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, 1<<20))
	} else {
		data, err = os.ReadFile(b.cert)
	}
	if err != nil {
		return nil, fmt.Errorf("--cert: %w", err)
	}
	all, err := pemutil.ParseCertificates(data)
	if err != nil {
		return nil, fmt.Errorf("--cert %s: %w", b.cert, err)
	}
	var leaves []*x509.Certificate
	for _, c := range all {
		if !c.IsCA {
			leaves = append(leaves, c)
		}
	}
	if len(leaves) == 0 {
		return nil, fmt.Errorf("--cert %s holds no certificate that is not a CA's", b.cert)
	}
	return leaves, nil
}

// do revokes --cert's certificates in the backend, or prints them
// (--dry-run).
func (b *revokeBackendFlags) do(ctx context.Context, cmd *cobra.Command, f *revokeFlags) (*revokeResult, error) {
	reason := 0
	if f.reason != "" {
		var err error
		if reason, err = parseReason(f.reason, false); err != nil {
			return nil, &exitError{code: exitUsage, err: err}
		}
	}
	certs, err := b.readCerts(f.stdin)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	res := &revokeResult{}
	for _, c := range certs {
		res.planned = append(res.planned, keymgr.Revocation{Serial: c.SerialNumber, Reason: reason, RevokedAt: f.now(),
			NotAfter: c.NotAfter, Subject: certIdentity(c)})
	}
	out := cmd.OutOrStdout()
	writeRevocations(out, res.planned)
	if f.dryRun {
		fmt.Fprintf(out, "dry run: %d certificate(s) would be revoked in Vault (%s); nothing changed\n", len(certs), b.vault.mount)
		return res, nil
	}
	rv, err := b.open(cmd)
	if err != nil {
		return res, &exitError{code: exitUsage, err: err}
	}
	for i, c := range certs {
		if err := rv.Revoke(ctx, signer.Revocation{Serial: c.SerialNumber, Cert: c}); err != nil {
			code := exitUsage
			if signer.KindOf(err) == signer.KindRefused {
				code = exitRefused
			}
			return res, &exitError{code: code, err: fmt.Errorf("%d of %d revoked; serial %s: %w", i, len(certs), serialText(c.SerialNumber), err)}
		}
		res.added++
	}
	res.saved = true
	fmt.Fprintf(out, "%d certificate(s) revoked in Vault (%s): the replicas of meshca serve --publish-crl publish Vault's CRLs within %s\n",
		len(certs), b.vault.mount, serve.DefaultCRLPoll)
	return res, nil
}

// open logs in to Vault as the flags say.
func (b *revokeBackendFlags) open(cmd *cobra.Command) (signer.Revoker, error) {
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	login, err := b.vault.loginConfig(log)
	if err != nil {
		return nil, err
	}
	return newVaultRevoker(vault.Config{Address: login.Address, CACertFile: login.CACertFile, Mount: b.vault.mount, Auth: login.Auth,
		OnLoginError: login.OnLoginError})
}

// certIdentity is what c certifies, for the table: its URI SANs, else its
// DNS names, else its subject.
func certIdentity(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	}
	return c.Subject.String()
}
