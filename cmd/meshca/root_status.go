package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// authorityView is one authority as `meshca root status` shows it.
type authorityView struct {
	ID string `json:"id"`
	// Fingerprint is the signing certificate's: the authority's id in
	// full. RootFingerprint is its root's, which authorities sharing the
	// root have in common.
	Fingerprint     string    `json:"sha256"`
	RootFingerprint string    `json:"rootSha256"`
	Subject         string    `json:"subject"`
	KeyType         string    `json:"keyType"`
	State           string    `json:"state"`
	NotAfter        time.Time `json:"notAfter"`
	Since           time.Time `json:"since"`
	External        bool      `json:"external,omitempty"`
	Generated       bool      `json:"generated,omitempty"`
	// Signing is the certificate that signs under the root, when it is
	// an intermediate: its expiry, not the root's, ends the authority.
	Signing *signingView `json:"signing,omitempty"`
	// Upstream is where the root's key is, when meshca serve --upstream
	// renews the intermediate.
	Upstream *upstream.Ref `json:"upstream,omitempty"`
}

// signingView is an authority's intermediate signing certificate.
type signingView struct {
	Subject  string    `json:"subject"`
	NotAfter time.Time `json:"notAfter"`
	// PathNotAfter is the earliest expiry from it up to the root.
	PathNotAfter time.Time `json:"pathNotAfter"`
}

// statusView is the whole of `meshca root status -o json`.
type statusView struct {
	Sequence    uint64          `json:"sequence"`
	Authorities []authorityView `json:"authorities"`
	Next        nextView        `json:"next"`
	// Istiod is istiod's certificate, with --istiod-cert-secret.
	Istiod *istiodView `json:"istiod,omitempty"`
	// CRLs of the state's CAs, the CAs meshca cannot sign one for, and
	// how many certificates and nodes are revoked (root_status_crl.go).
	CRLs         []crlView `json:"crls,omitempty"`
	CRLProblems  []string  `json:"crlProblems,omitempty"`
	Revoked      int       `json:"revoked,omitempty"`
	BlockedNodes int       `json:"blockedNodes,omitempty"`
}

type nextView struct {
	Step   string    `json:"step,omitempty"`
	ID     string    `json:"id,omitempty"`
	SafeAt time.Time `json:"safeAt,omitzero"`
	Why    string    `json:"why,omitempty"`
}

func newRootStatusCommand() *cobra.Command {
	var (
		store  storeFlags
		caDir  string
		output string
		margin time.Duration
		istiod string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every authority, its state, and the next safe rotation step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := contextWithTimeout(cmd, 30*time.Second)
			defer cancel()
			st, err := statusState(ctx, &store, caDir)
			if err != nil {
				return err
			}
			deps, err := store.dependents(ctx, istiod)
			if err != nil {
				return &exitError{code: exitUsage, err: err}
			}
			now := time.Now()
			v := viewOf(st, now, keymgr.Guards{Margin: margin, Dependents: deps})
			if istiod != "" {
				v.Istiod = istiodViewOf(istiod, deps[0], st, now)
			}
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			case "yaml":
				out, err := yaml.Marshal(v)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(out)
				return err
			case "table", "":
				return printStatus(cmd.OutOrStdout(), v, now)
			}
			return &exitError{code: exitUsage, err: fmt.Errorf("-o %q: want table, json or yaml", output)}
		},
	}
	store.register(cmd)
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "instead of a CA state, a plugged-in CA directory (as meshca serve --ca-dir), checked as a server checks it: "+
		"what it would serve, before the files are swapped in")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or yaml")
	cmd.Flags().DurationVar(&margin, "margin", keymgr.DefaultGuardMargin, "margin the guards add: to half the longest leaf lifetime before activate, to the last leaf's expiry before retire")
	cmd.Flags().StringVar(&istiod, "istiod-cert-secret", "", "show istiod's certificate from this Secret, namespace/name (as meshca serve --istiod-cert-secret), and hold the next step to it as activate and retire do")
	return cmd
}

// statusState is the state status shows: the CA state the flags name, or
// what a server on the plugged-in directory caDir would serve.
func statusState(ctx context.Context, store *storeFlags, caDir string) (*keymgr.State, error) {
	if caDir == "" {
		return store.load(ctx)
	}
	if store.stateDir != "" || store.stateSecret != "" {
		return nil, &exitError{code: exitUsage, err: errors.New("give --ca-dir or a CA state (--state-dir, --state-secret), not both")}
	}
	st, _, err := (&dirstore.PluggedDir{Dir: caDir}).Load(ctx)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return st, nil
}

func viewOf(st *keymgr.State, now time.Time, g keymgr.Guards) statusView {
	v := statusView{Sequence: st.Sequence}
	for _, a := range st.Authorities {
		av := authorityView{
			ID: shortID(a), Fingerprint: a.ID(), RootFingerprint: a.RootID(), Subject: a.Root.Subject.String(), KeyType: keyType(a.Root.PublicKey),
			State: string(a.Phase), NotAfter: a.Root.NotAfter, Since: a.Since(), External: a.External, Generated: a.Generated,
		}
		if a.Renewed() {
			ref := a.Upstream
			av.Upstream = &ref
		}
		if !a.SignsWithRoot() {
			av.Signing = &signingView{Subject: a.Cert.Subject.String(), NotAfter: a.Cert.NotAfter,
				PathNotAfter: certs.PathExpiry(a.Cert, append(append([]*x509.Certificate(nil), a.Chain...), a.Root)...)}
		}
		v.Authorities = append(v.Authorities, av)
	}
	next := st.View().NextStep(now, g)
	v.Next = nextView{Step: next.Verb, ID: short(next.ID), SafeAt: next.SafeAt, Why: next.Why}
	crlsOf(&v, st, now)
	return v
}

func printStatus(w io.Writer, v statusView, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSUBJECT\tKEY\tNOT AFTER\tIN STATE\tSHA-256")
	for _, a := range v.Authorities {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.State, a.Subject, a.KeyType,
			a.NotAfter.UTC().Format(time.RFC3339), now.Sub(a.Since).Round(time.Second), a.Fingerprint)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range v.Authorities {
		if a.Signing == nil {
			continue
		}
		from := ""
		if a.Upstream != nil {
			from = ", renewed from upstream " + a.Upstream.Type
		}
		left := "expired"
		if a.Signing.PathNotAfter.After(now) {
			left = "in " + a.Signing.PathNotAfter.Sub(now).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s signs with intermediate %s, not after %s (its path to the root: %s, %s), under root %s%s\n", a.ID, a.Signing.Subject,
			a.Signing.NotAfter.UTC().Format(time.RFC3339), a.Signing.PathNotAfter.UTC().Format(time.RFC3339), left, short(a.RootFingerprint), from)
	}
	printCRLs(w, v, now)
	fmt.Fprintf(w, "\nbundle sequence %d\n", v.Sequence)
	if v.Istiod != nil {
		printIstiod(w, v.Istiod)
	}
	step := strings.TrimSpace(v.Next.Step + " " + v.Next.ID)
	switch {
	case v.Next.Step == "":
		fmt.Fprintf(w, "next step: none (%s)\n", v.Next.Why)
	case !v.Next.SafeAt.After(now):
		fmt.Fprintf(w, "next step: %s, safe now (%s)\n", step, v.Next.Why)
	default:
		fmt.Fprintf(w, "next step: %s, safe at %s, in %s (%s)\n", step,
			v.Next.SafeAt.UTC().Format(time.RFC3339), v.Next.SafeAt.Sub(now).Round(time.Second), v.Next.Why)
	}
	return nil
}

// shortID is the first 16 hex digits of an authority's fingerprint: what
// the other verbs accept (any unique prefix of 8 or more does).
func shortID(a *keymgr.AuthorityRecord) string { return short(a.ID()) }

func short(id string) string {
	if len(id) > 16 {
		return id[:16]
	}
	return id
}

func keyType(pub any) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	}
	return fmt.Sprintf("%T", pub)
}
