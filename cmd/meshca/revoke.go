package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// exitNotFound is meshca revoke's exit code when the audit log has no
// record of what it was asked to revoke (a serial, a node).
const exitNotFound = 3

// revokeFlags are meshca revoke's.
type revokeFlags struct {
	serial, intermediate, node string
	undo, dryRun, force        bool
	reason, since, by          string
	issuer, notAfter           string
	auditLog                   string
	store                      storeFlags
	backend                    revokeBackendFlags
	audit                      auditFlags
	stdin                      io.Reader
	now                        func() time.Time
}

const revokeLong = `revoke lists a certificate on the CRL of the CA that signed it, which meshca serve keeps in the CA
state and publishes (istio-ca-crl); ztunnel then refuses it on every connection. It works on the CA
state as meshca root does (--state-dir or --state-secret) and needs no server up: the serving leader
reissues its CRLs when the state changes.

  --serial S --reason R         one certificate; its issuer and NotAfter from --audit-log (meshca's
                                audit log), or --issuer and --not-after when meshca has no record of it
  --intermediate ID --reason R  a signing intermediate of the CA state (not a root; not the active one
                                without --force), on its issuer's CRL
  --node N --since T --reason R every certificate still valid that meshca issued on node N since T (to
                                its proxy or through it, to callers bound to its Pods, to its Pods at its
                                kubelet's request; from --audit-log); then nothing on N gets a certificate
  --signer vault --cert FILE    certificates Vault signed: revoked in Vault's PKI mount, by the
                                certificate (its meshca roles keep no serials), at once; meshca serve
                                --publish-crl publishes Vault's CRLs. No --undo: Vault cannot take it back
  --undo                        takes it back: a serial or intermediate leaves the CRL; a node is unblocked
                                (what was revoked with it stays revoked)
  --dry-run                     prints what would be revoked and changes nothing

Exit codes: 0 done; 1 refused (the CA state does not allow it); 2 usage; 3 the audit log has no record
of the serial or the node.`

const revokeExamples = `  meshca revoke --state-secret istio-system/meshca-ca-state --serial 5f1c0e... --reason keyCompromise --audit-log audit.log
  kubectl logs -n istio-system -l app.kubernetes.io/name=meshca --tail=-1 | meshca revoke --state-secret istio-system/meshca-ca-state --node worker-3 --since 24h --reason keyCompromise --audit-log -
  meshca revoke --state-dir /var/lib/meshca --node worker-3 --undo
  istioctl proxy-config secret pod-a.app -o json | jq -r '.dynamicActiveSecrets[0].secret.tlsCertificate.certificateChain.inlineBytes' | base64 -d |
    meshca revoke --signer vault --cert - --vault-addr https://vault:8200 --vault-token-file token --reason keyCompromise`

func newRevokeCommand() *cobra.Command {
	f := &revokeFlags{now: time.Now}
	cmd := &cobra.Command{
		Use:     "revoke (--serial S | --intermediate ID | --node N | --signer vault --cert FILE) [--undo] [--dry-run]",
		Short:   "Revoke a certificate, a signing intermediate, or everything a node's proxy was given",
		Long:    revokeLong,
		Example: revokeExamples,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	groups := f.groups(cmd)
	registerGroups(cmd.Flags(), groups)
	setGroupedHelp(cmd, groups)
	return cmd
}

func (f *revokeFlags) groups(cmd *cobra.Command) []flagGroup {
	return []flagGroup{
		{title: "What", key: []string{"serial", "intermediate", "node", "undo", "dry-run"}, register: func(fl *pflag.FlagSet) {
			fl.StringVar(&f.serial, "serial", "", "revoke the certificate of this serial number: hex (as the audit log and openssl x509 -serial write it), or decimal; hex:... or dec:... when digits alone could be either")
			fl.StringVar(&f.intermediate, "intermediate", "", "revoke the signing intermediate of this authority (its id or a prefix, as meshca root status lists it)")
			fl.StringVar(&f.node, "node", "", "revoke every certificate issued on this node since --since (through its proxy, to its Pods), and block the node")
			fl.BoolVar(&f.undo, "undo", false, "take back the revocation of --serial or --intermediate, or unblock --node")
			fl.BoolVar(&f.dryRun, "dry-run", false, "print what would be revoked; change nothing")
		}},
		{title: "Revocation", key: []string{"reason", "audit-log", "since"}, register: func(fl *pflag.FlagSet) {
			fl.StringVar(&f.reason, "reason", "", "the CRL reason: "+reasonNames)
			fl.StringVar(&f.auditLog, "audit-log", "", "meshca's audit log to READ (a file, gzip-compressed or not, or - for standard input): where --serial finds its issuer and NotAfter and --node its certificates")
			fl.StringVar(&f.since, "since", "", "--node: the start of the window, an RFC 3339 time or a duration before now (24h)")
			fl.StringVar(&f.issuer, "issuer", "", "--serial: the id (or a prefix) of the CA certificate that signed it, when the audit log does not say")
			fl.StringVar(&f.notAfter, "not-after", "", "--serial: the certificate's NotAfter (RFC 3339), when the audit log does not say")
			fl.BoolVar(&f.force, "force", false, "--intermediate: revoke the active authority's intermediate (every certificate it signs is refused from then on)")
			fl.StringVar(&f.by, "by", "", "who revokes, for the CA state and the audit trail; default: the OS user")
		}},
		{title: "CA state", key: []string{"state-dir", "state-secret"}, register: func(*pflag.FlagSet) { f.store.register(cmd) }},
		{title: "Vault backend", key: []string{"signer", "cert", "vault-addr"}, register: f.backend.register},
		{title: "Audit", key: []string{"audit-log-file"}, register: func(fl *pflag.FlagSet) { f.audit.register(fl, "standard error") }},
	}
}

// run checks the flags, works out the change, and makes it (or prints
// it, --dry-run), audited.
func (f *revokeFlags) run(cmd *cobra.Command) error {
	f.stdin = cmd.InOrStdin()
	verb, err := f.check()
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			return err
		}
		return &exitError{code: exitUsage, err: err}
	}
	audit, err := f.audit.stepAuditor(cmd, "")
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	defer audit.close()
	ctx, cancel := contextWithTimeout(cmd, 5*time.Minute)
	defer cancel()
	var res *revokeResult
	if f.backend.local() {
		res, err = f.do(ctx, cmd, verb)
	} else {
		res, err = f.backend.do(ctx, cmd, f)
	}
	if !f.dryRun {
		audit.revocation(ctx, verb, f, res, err)
	}
	return err
}

// check refuses flags that do not go together; it returns the verb.
func (f *revokeFlags) check() (string, error) {
	if err := f.backend.check(f); err != nil {
		return "", err
	}
	if !f.backend.local() {
		if f.by == "" {
			f.by = operator()
		}
		return keymgr.VerbRevoke, nil
	}
	n := 0
	for _, v := range []string{f.serial, f.intermediate, f.node} {
		if v != "" {
			n++
		}
	}
	switch {
	case n != 1:
		return "", errors.New("give exactly one of --serial, --intermediate and --node")
	case f.node != "" && strings.TrimSpace(f.node) != f.node:
		return "", fmt.Errorf("--node %q has surrounding spaces", f.node)
	case f.undo && (f.since != "" || f.notAfter != "" || f.auditLog != ""):
		return "", errors.New("--undo takes back what the CA state holds: --since, --not-after and --audit-log do not apply")
	case f.node == "" && f.since != "":
		return "", errors.New("--since applies to --node")
	case f.serial == "" && (f.issuer != "" || f.notAfter != ""):
		return "", errors.New("--issuer and --not-after apply to --serial")
	case f.intermediate == "" && f.force:
		return "", errors.New("--force applies to --intermediate")
	case f.node != "" && !f.undo && (f.since == "" || f.auditLog == ""):
		return "", errors.New("--node needs --since (when its compromise may have begun) and --audit-log (where meshca recorded what it issued)")
	}
	if f.by == "" {
		f.by = operator()
	}
	switch {
	case f.node != "" && f.undo:
		return keymgr.VerbUnblock, nil
	case f.undo:
		return keymgr.VerbUnrevoke, nil
	case f.node != "":
		return keymgr.VerbBlock, nil
	}
	return keymgr.VerbRevoke, nil
}

// openAuditLog opens --audit-log: a file, or standard input for -.
func (f *revokeFlags) openAuditLog() (io.Reader, string, func(), error) {
	if f.auditLog == "-" {
		return f.stdin, "standard input", func() {}, nil
	}
	file, err := os.Open(f.auditLog)
	if err != nil {
		return nil, "", nil, fmt.Errorf("--audit-log: %w", err)
	}
	return file, f.auditLog, func() { _ = file.Close() }, nil
}

// readIssued reads --audit-log, keeping the issuances keep selects; the
// broken lines' warning goes to w.
func (f *revokeFlags) readIssued(w io.Writer, keep func(*issuance) bool) ([]*issuance, *auditScan, string, error) {
	r, name, closeFn, err := f.openAuditLog()
	if err != nil {
		return nil, nil, "", &exitError{code: exitUsage, err: err}
	}
	defer closeFn()
	var found []*issuance
	scan, err := readAuditLog(r, func(c *issuance) {
		if keep(c) {
			found = append(found, c)
		}
	})
	if err != nil {
		return nil, nil, name, &exitError{code: exitUsage, err: fmt.Errorf("--audit-log %s: %w", name, err)}
	}
	if msg := scan.warning(name); msg != "" {
		fmt.Fprintln(w, msg)
	}
	return found, scan, name, nil
}

// serialText is a serial number as the audit log writes it.
func serialText(n *big.Int) string { return n.Text(16) }

// maxAuditedSerials bounds the serials one revocation event lists.
const maxAuditedSerials = 100

// revocation writes the event of one meshca revoke run: its verb, the
// serials (and their issuers when one), the node, the authority of an
// intermediate, the CRL reason, and why it was refused.
func (s *stepAuditor) revocation(ctx context.Context, verb string, f *revokeFlags, res *revokeResult, err error) {
	e := &ca.AuditEvent{Event: ca.EventRevocation, Decision: ca.DecisionTaken, Source: ca.SourceCLI, RequestID: s.id,
		Caller: f.by, Pod: podName(), Verb: verb, Node: f.node, Reason: f.reason, Forced: f.force}
	if res != nil {
		e.Authority = res.authority
		var serials []string
		issuers := map[string]bool{}
		for i, r := range res.planned {
			if i == maxAuditedSerials {
				serials = append(serials, fmt.Sprintf("and %d more", len(res.planned)-i))
				break
			}
			serials, issuers[r.Issuer] = append(serials, serialText(r.Serial)), true
		}
		e.Serial = strings.Join(serials, ",")
		if len(issuers) == 1 {
			for id := range issuers {
				e.Issuer = id
			}
		}
	}
	if err != nil {
		e.Decision, e.Detail = ca.DecisionRefused, err.Error()
	}
	s.sink.Audit(ctx, e)
}
