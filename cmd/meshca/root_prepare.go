package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spf13/cobra"
)

type prepareFlags struct {
	store       storeFlags
	keyType     string
	lifetime    time.Duration
	trustDomain string
	certFile    string
	keyFile     string
	chainFile   string
	rootFile    string
	caDir       string
	external    bool
	issuedTTL   time.Duration
	reason      string
	signer      rootSignerFlags
	up          upstreamFlags
	audit       auditFlags
	// renewer made the authority in --upstream; nil without one.
	renewer *keymgr.Renewer
}

func newRootPrepareCommand() *cobra.Command {
	f := &prepareFlags{}
	cmd := &cobra.Command{
		Use:   "prepare",
		Short: "Add a new authority, trusted but not yet signing: generated, or imported",
		Long: "prepare adds an authority to the trust bundle without signing with it, so that workloads learn\n" +
			"its root from their next renewals before `meshca root activate` makes it sign. Without import\n" +
			"flags it generates a new, independent root key; --cert/--key (with --chain and --root for an\n" +
			"intermediate), or --ca-dir in Istio's cacerts layout, import one; --external imports the same\n" +
			"certificates without the key, which lives in an external backend (Vault, cfssl, the controller\n" +
			"of a k8scsr signer): meshca then manages trust only.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	f.register(cmd)
	return cmd
}

// register registers prepare's flags on cmd.
func (f *prepareFlags) register(cmd *cobra.Command) {
	f.store.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.keyType, "key-type", string(certs.KeyECP256), fmt.Sprintf("key type of a generated root: %v", certs.KeyTypes))
	fl.DurationVar(&f.lifetime, "lifetime", keymgr.DefaultRootTTL, "lifetime of a generated root")
	fl.StringVar(&f.trustDomain, "trust-domain", "", "organisation of a generated root's subject; default: the active root's, else cluster.local")
	fl.StringVar(&f.certFile, "cert", "", "import: the signing certificate (a root, or an intermediate with --root)")
	fl.StringVar(&f.keyFile, "key", "", "import: the signing certificate's private key")
	fl.StringVar(&f.chainFile, "chain", "", "import: certificates between --cert and the root (PEM)")
	fl.StringVar(&f.rootFile, "root", "", "import: the root above an intermediate --cert")
	fl.StringVar(&f.caDir, "ca-dir", "", "import a CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem)")
	fl.BoolVar(&f.external, "external", false, "import the certificates of an external backend's signing authority without its key (--cert, with --chain and --root for an intermediate): meshca manages trust, the backend signs")
	fl.DurationVar(&f.issuedTTL, "issued-ttl", ca.DefaultMaxTTL, "an imported CA that becomes the first authority may have signed before (istiod, a plugged-in meshca, "+
		"a cfssl server): the guards assume leaves of up to this lifetime were issued under it; 0 when it never signed")
	fl.StringVar(&f.reason, "reason", "", "why, for the history and the audit log")
	f.signer.register(fl, "prepare")
	f.registerUpstream(fl)
	f.audit.register(fl, "standard error")
}

// run takes the step: the authority made in the backend, or by the
// flags, added to the CA state, audited and reported.
func (f *prepareFlags) run(cmd *cobra.Command) error {
	audit, err := f.audit.stepAuditor(cmd, f.signer.signer)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	defer audit.close()
	ctx, cancel := contextWithTimeout(cmd, 60*time.Second)
	defer cancel()
	store, notice, err := f.store.openForStep(ctx)
	if err != nil {
		return err
	}
	f.signer.out = cmd.OutOrStdout()
	made, err := f.inBackend(ctx, store)
	if err != nil {
		audit.step(ctx, "prepare", "", false, f.reason, err)
		return rootError(err)
	}
	var added *keymgr.AuthorityRecord
	st, err := keymgr.Update(ctx, store, func(s *keymgr.State) error {
		added, err = f.add(s, made)
		return err
	})
	if err != nil {
		audit.step(ctx, "prepare", authorityID(added), false, f.reason, err)
		return rootError(f.discard(ctx, store, made, err))
	}
	audit.step(ctx, "prepare", added.ID(), false, f.reason, nil)
	if added.Renewed() {
		audit.intermediate(ctx, added)
	}
	tell(cmd.ErrOrStderr(), notice)
	rec, _ := st.View().Lookup(added.ID())
	f.report(cmd.OutOrStdout(), st, rec)
	return nil
}

// add adds the authority to s: made, copied afresh for every attempt of
// the update (the step writes its history), or one the flags build. The
// first authority of a state is bootstrapped, active at once.
func (f *prepareFlags) add(s *keymgr.State, made *keymgr.AuthorityRecord) (*keymgr.AuthorityRecord, error) {
	rec := made
	if rec == nil {
		var err error
		if rec, err = f.record(s); err != nil {
			return nil, err
		}
	} else {
		c := *made
		rec = &c
	}
	if s.Active() != nil {
		return rec, s.Prepare(rec, time.Now(), f.reasonOr("prepared by meshca root prepare"))
	}
	now := time.Now()
	if err := s.Bootstrap(rec, now, f.reasonOr("first authority")); err != nil {
		return rec, err
	}
	if f.imports() && f.issuedTTL > 0 {
		s.RecordPrior(rec.ID(), f.issuedTTL, now)
	}
	return rec, nil
}

// report says what prepare added to st.
func (f *prepareFlags) report(w io.Writer, st *keymgr.State, rec *keymgr.AuthorityRecord) {
	fmt.Fprintf(w, "%s %s (%s, %s, not after %s); bundle sequence %d\n", rec.Phase, shortID(rec),
		rec.Root.Subject, keyType(rec.Root.PublicKey), rec.Root.NotAfter.UTC().Format(time.RFC3339), st.Sequence)
	if rec.Phase == keymgr.PhaseActive && f.imports() && f.issuedTTL > 0 {
		fmt.Fprintf(w, "the guards assume leaves of up to %s (--issued-ttl) were issued under it before\n", f.issuedTTL)
	}
	if !rec.SignsWithRoot() {
		fmt.Fprintf(w, "signs with intermediate %s (%s, not after %s) under root %s\n",
			rec.Cert.Subject, keyType(rec.Cert.PublicKey), rec.Cert.NotAfter.UTC().Format(time.RFC3339), short(rec.RootID()))
	}
	if rec.Renewed() {
		fmt.Fprintf(w, "its root's key is in upstream %s; meshca serve --upstream %s renews the intermediate\n", upstreamRef(rec), rec.Upstream.Type)
	}
}

// inBackend creates the authority in an external signer (a Vault issuer),
// or returns nil when the flags alone build it.
func (f *prepareFlags) inBackend(ctx context.Context, store keymgr.StateStore) (*keymgr.AuthorityRecord, error) {
	be, err := f.signer.backend(ctx)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	cur, _, err := store.Load(ctx)
	switch {
	case errors.Is(err, keymgr.ErrNoState):
		cur = &keymgr.State{}
	case err != nil:
		return nil, err
	default:
		if err := validStored(cur); err != nil {
			return nil, err
		}
	}
	rec, err := f.inUpstream(ctx, cur, slog.New(slog.NewTextHandler(f.signer.out, nil)))
	if rec == nil && err == nil {
		rec, err = be.prepare(ctx, cur, f)
	}
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return rec, nil
}

// imports reports whether the flags import an authority that may have
// signed before, rather than make a new key.
func (f *prepareFlags) imports() bool { return f.certFile != "" || f.caDir != "" }

func (f *prepareFlags) reasonOr(def string) string {
	if f.reason != "" {
		return f.reason
	}
	return def
}

// record builds the authority to add from the flags.
func (f *prepareFlags) record(s *keymgr.State) (*keymgr.AuthorityRecord, error) {
	imports := 0
	for _, set := range []bool{f.certFile != "", f.caDir != ""} {
		if set {
			imports++
		}
	}
	switch {
	case imports > 1:
		return nil, errors.New("give --cert/--key or --ca-dir, not both")
	case f.external && f.certFile == "":
		return nil, errors.New("--external imports the backend's signing certificate: give it with --cert (a root, or an intermediate with --root)")
	case f.external && f.keyFile != "":
		return nil, errors.New("--external imports certificates whose key lives in the backend: give no --key")
	case f.caDir != "":
		a, err := keymgr.LoadCACerts(f.caDir, time.Now())
		if err != nil {
			return nil, fmt.Errorf("--ca-dir: %w", err)
		}
		top := a.Cert
		if len(a.Chain) > 0 {
			top = a.Chain[len(a.Chain)-1]
		}
		for _, r := range a.Roots {
			if top.Equal(r) || top.CheckSignatureFrom(r) == nil {
				return &keymgr.AuthorityRecord{Root: r, Cert: a.Cert, Chain: a.Chain, Key: a.Key}, nil
			}
		}
		return nil, fmt.Errorf("--ca-dir: no root in %s signs the chain", keymgr.FileRootCert)
	case f.certFile != "":
		return f.imported()
	}
	a, err := keymgr.NewRoot(keymgr.RootOptions{KeyType: certs.KeyType(f.keyType), Organization: f.organization(s), TTL: f.lifetime})
	if err != nil {
		return nil, fmt.Errorf("--key-type: %w", err)
	}
	return &keymgr.AuthorityRecord{Root: a.Cert, Cert: a.Cert, Key: a.Key, Generated: true}, nil
}

// organization is a generated root's: --trust-domain, else the active
// root's, else cluster.local.
func (f *prepareFlags) organization(s *keymgr.State) string {
	if f.trustDomain != "" {
		return f.trustDomain
	}
	if a := s.Active(); a != nil && len(a.Root.Subject.Organization) > 0 {
		return a.Root.Subject.Organization[0]
	}
	return "cluster.local"
}

func (f *prepareFlags) imported() (*keymgr.AuthorityRecord, error) {
	cert, err := readOne("--cert", f.certFile)
	if err != nil {
		return nil, err
	}
	if f.rootFile == "" && !certs.IsSelfSigned(cert) {
		return nil, fmt.Errorf("--cert %s is not a root (its issuer is %q): give its root with --root, and --chain for the intermediates between", f.certFile, cert.Issuer)
	}
	rec := &keymgr.AuthorityRecord{Root: cert, Cert: cert, External: f.external}
	if !f.external {
		if f.keyFile == "" {
			return nil, errors.New("--cert needs --key (or --external for certificates whose key meshca does not hold)")
		}
		raw, err := os.ReadFile(f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
		if rec.Key, err = pemutil.ParsePrivateKey(raw); err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
	}
	if f.chainFile != "" {
		if rec.Chain, err = readCerts("--chain", f.chainFile); err != nil {
			return nil, err
		}
	}
	if f.rootFile != "" {
		if rec.Root, err = readOne("--root", f.rootFile); err != nil {
			return nil, err
		}
	}
	return rec, nil
}

func readOne(flag, path string) (*x509.Certificate, error) {
	certs, err := readCerts(flag, path)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("%s: %s holds %d certificates, want one", flag, path, len(certs))
	}
	return certs[0], nil
}

// authorityID is rec's id, or "" before there is one.
func authorityID(rec *keymgr.AuthorityRecord) string {
	if rec == nil {
		return ""
	}
	return rec.ID()
}
