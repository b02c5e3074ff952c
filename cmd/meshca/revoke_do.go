package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
)

// revokeResult is what one meshca revoke run did, for its report and
// its audit event.
type revokeResult struct {
	planned []keymgr.Revocation
	added   int
	// gone are planned revocations whose issuer was retired (or was no
	// CA of the state) when the change was saved: skipped.
	gone      []keymgr.Revocation
	authority string // --intermediate's authority id
	block     *keymgr.NodeBlock
	saved     bool // the change was saved
}

// do works out the change of verb and makes it, or prints it.
func (f *revokeFlags) do(ctx context.Context, cmd *cobra.Command, verb string) (*revokeResult, error) {
	store, notice, err := f.store.openForStep(ctx)
	if err != nil {
		return nil, err
	}
	st, _, err := store.Load(ctx)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	if err := validStored(st); err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	res := &revokeResult{}
	var change func(*keymgr.State) error
	switch verb {
	case keymgr.VerbUnrevoke:
		change, err = f.unrevoke(st, res)
	case keymgr.VerbUnblock:
		change = func(s *keymgr.State) error { return s.Unblock(f.node) }
	default:
		if err = f.plan(cmd.ErrOrStderr(), st, res); err == nil {
			change = f.revoke(res)
		}
	}
	if err != nil {
		return res, err
	}
	if f.dryRun {
		writeRevocations(cmd.OutOrStdout(), res.planned)
		fmt.Fprintf(cmd.OutOrStdout(), "dry run: %s; nothing changed\n", res.summary(verb, f.node))
		return res, nil
	}
	saved, err := keymgr.Update(ctx, store, change)
	if err != nil {
		return res, revokeError(err)
	}
	res.saved = true
	tell(cmd.ErrOrStderr(), notice)
	writeRevocations(cmd.OutOrStdout(), res.planned)
	fmt.Fprintf(cmd.OutOrStdout(), "%s; CA state saved (%d revocation(s), %d blocked node(s)): the serving leader reissues the CRLs\n",
		res.summary(verb, f.node), len(saved.Revocations), len(saved.Blocked))
	return res, nil
}

// revokeError gives a refused change its exit code: 1 for what the state
// refuses, 2 for anything else.
func revokeError(err error) error {
	var (
		ee *exitError
		se *keymgr.StateError
	)
	switch {
	case errors.As(err, &ee):
		return err
	case errors.As(err, &se), errors.Is(err, keymgr.ErrNotRevoked), errors.Is(err, keymgr.ErrNotBlocked):
		return &exitError{code: exitRefused, err: err}
	}
	return &exitError{code: exitUsage, err: err}
}

// revoke is the change that saves res's plan on the state as it is then
// (keymgr.Update may call it again on a newer one): revocations whose
// issuer was retired meanwhile are skipped, the others added, the node
// blocked.
func (f *revokeFlags) revoke(res *revokeResult) func(*keymgr.State) error {
	return func(s *keymgr.State) error {
		live, gone := liveOnly(s, res.planned)
		added, err := s.Revoke(live, f.now())
		if err != nil {
			return err
		}
		res.added, res.gone = added, gone
		if res.block != nil {
			return s.Block(*res.block)
		}
		return nil
	}
}

// plan works out the revocations of --serial, --intermediate or --node
// from the state st and the audit log.
func (f *revokeFlags) plan(w io.Writer, st *keymgr.State, res *revokeResult) error {
	code, err := parseReason(f.reason, f.intermediate != "")
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	now := f.now()
	switch {
	case f.intermediate != "":
		r, err := planIntermediate(st, f.intermediate, f.force, f.now())
		if err != nil {
			return revokeError(err)
		}
		rec, _ := st.View().Lookup(f.intermediate)
		res.planned, res.authority = []keymgr.Revocation{r}, rec.ID()
	case f.serial != "":
		if res.planned, err = f.planSerial(w, st); err != nil {
			return err
		}
	default:
		if res.planned, err = f.planNode(w, now); err != nil {
			return err
		}
		since, _ := parseSince(f.since, now)
		res.block = &keymgr.NodeBlock{Node: f.node, Since: since, At: now, Reason: f.reason, By: f.by}
	}
	for i := range res.planned {
		res.planned[i].Reason, res.planned[i].RevokedAt, res.planned[i].By = code, now, f.by
	}
	return nil
}

// planSerial finds --serial in the audit log, or takes --issuer and
// --not-after.
func (f *revokeFlags) planSerial(w io.Writer, st *keymgr.State) ([]keymgr.Revocation, error) {
	candidates, err := parseSerial(f.serial)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	var notAfter time.Time
	if f.notAfter != "" {
		if notAfter, err = time.Parse(time.RFC3339, f.notAfter); err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--not-after %q: want an RFC 3339 time", f.notAfter)}
		}
	}
	given := f.issuer != "" && f.notAfter != ""
	if f.auditLog == "" {
		switch {
		case len(candidates) > 1:
			return nil, &exitError{code: exitUsage, err: ambiguous(f.serial)}
		case !given:
			return nil, &exitError{code: exitUsage, err: errors.New("--serial needs --audit-log (meshca's audit log, where it finds the serial's issuer and NotAfter), or --issuer and --not-after")}
		}
		return planSerialOrRefuse(st, candidates[0], nil, f.issuer, notAfter)
	}
	found, _, name, err := f.readIssued(w, func(c *issuance) bool {
		return slices.ContainsFunc(candidates, func(n *big.Int) bool { return n.Cmp(c.Serial) == 0 })
	})
	if err != nil {
		return nil, err
	}
	serials := map[string]*big.Int{}
	for _, c := range found {
		serials[c.Serial.String()] = c.Serial
	}
	switch {
	case len(serials) > 1:
		return nil, &exitError{code: exitUsage, err: ambiguous(f.serial)}
	case len(serials) == 0 && !given:
		return nil, &exitError{code: exitNotFound, err: fmt.Errorf("meshca has no record of issuing serial %s in %s; if it did (in a log since rotated away, say), "+
			"give the certificate's --issuer and --not-after", serialText(candidates[0]), name)}
	case len(serials) == 0 && len(candidates) > 1:
		return nil, &exitError{code: exitUsage, err: ambiguous(f.serial)}
	case len(serials) == 0:
		return planSerialOrRefuse(st, candidates[0], nil, f.issuer, notAfter)
	}
	return planSerialOrRefuse(st, found[0].Serial, found, f.issuer, notAfter)
}

func planSerialOrRefuse(st *keymgr.State, serial *big.Int, found []*issuance, issuer string, notAfter time.Time) ([]keymgr.Revocation, error) {
	rs, err := planSerial(st, serial, found, issuer, notAfter)
	if err != nil {
		return nil, &exitError{code: exitRefused, err: err}
	}
	return rs, nil
}

// planNode finds in the audit log what node's proxy was issued since
// --since and is still valid.
func (f *revokeFlags) planNode(w io.Writer, now time.Time) ([]keymgr.Revocation, error) {
	since, err := parseSince(f.since, now)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	found, scan, name, err := f.readIssued(w, func(c *issuance) bool { return c.throughNode(f.node) })
	if err != nil {
		return nil, err
	}
	if !scan.Nodes[f.node] {
		return nil, &exitError{code: exitNotFound, err: fmt.Errorf("meshca has no record of node %q in %s: no certificate request names it; nothing changed "+
			"(check the name with kubectl get nodes, and that the log covers the window)", f.node, name)}
	}
	return planNode(f.node, since, now, found), nil
}

// parseSince reads --since: an RFC 3339 time, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-12-06T09:00:00Z) or a positive duration before now (24h)", s)
	}
	return now.Add(-d), nil
}

// unrevoke is the change of --undo for --serial or --intermediate.
func (f *revokeFlags) unrevoke(st *keymgr.State, res *revokeResult) (func(*keymgr.State) error, error) {
	if f.intermediate != "" {
		rec, err := st.View().Lookup(f.intermediate)
		if err != nil {
			return nil, revokeError(err)
		}
		serial, issuer := rec.Cert.SerialNumber, keymgr.Fingerprint(issuerOfIntermediate(rec))
		res.authority = rec.ID()
		res.planned = matching(st, func(r keymgr.Revocation) bool { return r.Serial.Cmp(serial) == 0 && r.Issuer == issuer })
		return func(s *keymgr.State) error { return s.Unrevoke(serial, issuer) }, nil
	}
	candidates, err := parseSerial(f.serial)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	issuer := strings.ToLower(f.issuer)
	res.planned = matching(st, func(r keymgr.Revocation) bool {
		return slices.ContainsFunc(candidates, func(n *big.Int) bool { return n.Cmp(r.Serial) == 0 }) && strings.HasPrefix(r.Issuer, issuer)
	})
	serials := map[string]bool{}
	for _, r := range res.planned {
		serials[r.Serial.String()] = true
	}
	switch {
	case len(serials) > 1:
		return nil, &exitError{code: exitUsage, err: ambiguous(f.serial)}
	case len(res.planned) == 0:
		return nil, &exitError{code: exitRefused, err: fmt.Errorf("%w: serial %s%s", keymgr.ErrNotRevoked, serialText(candidates[0]), issuerNote(f.issuer))}
	}
	taken := slices.Clone(res.planned)
	return func(s *keymgr.State) error {
		for _, r := range taken {
			if err := s.Unrevoke(r.Serial, r.Issuer); err != nil && !errors.Is(err, keymgr.ErrNotRevoked) {
				return err
			}
		}
		return nil
	}, nil
}

func issuerNote(issuer string) string {
	if issuer == "" {
		return ""
	}
	return " by " + issuer
}

// matching are the revocations of st that keep selects.
func matching(st *keymgr.State, keep func(keymgr.Revocation) bool) []keymgr.Revocation {
	var out []keymgr.Revocation
	for _, r := range st.Revocations {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// summary says in one line what the run did (or would do).
func (r *revokeResult) summary(verb, node string) string {
	switch verb {
	case keymgr.VerbUnrevoke:
		return fmt.Sprintf("took back %d revocation(s)", len(r.planned))
	case keymgr.VerbUnblock:
		return fmt.Sprintf("node %s unblocked: certificates may be issued on it again (what was revoked with it stays revoked)", node)
	}
	s := fmt.Sprintf("%d certificate(s) to revoke", len(r.planned))
	if r.added > 0 || len(r.gone) > 0 || r.saved {
		s = fmt.Sprintf("revoked %d certificate(s)", r.added)
		var notes []string
		if n := len(r.planned) - r.added - len(r.gone); n > 0 {
			notes = append(notes, fmt.Sprintf("%d already revoked or expired", n))
		}
		if len(r.gone) > 0 {
			notes = append(notes, fmt.Sprintf("%d whose issuer was retired meanwhile, so expired", len(r.gone)))
		}
		if len(notes) > 0 {
			s += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	switch {
	case r.block != nil && r.saved:
		s += fmt.Sprintf("; node %s blocked: nothing on it gets a certificate until meshca revoke --node %s --undo", node, node)
	case r.block != nil:
		s += fmt.Sprintf("; node %s to block: nothing on it would get a certificate until meshca revoke --node %s --undo", node, node)
	}
	return s
}

// writeRevocations prints rs as a table.
func writeRevocations(w io.Writer, rs []keymgr.Revocation) {
	if len(rs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERIAL\tIDENTITY\tISSUER\tNOT AFTER\tNODE")
	for _, r := range rs {
		issuer := short(r.Issuer)
		if issuer == "" {
			issuer = "(any: not recorded)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", serialText(r.Serial), dash(r.Subject), issuer, r.NotAfter.UTC().Format(time.RFC3339), dash(r.Node))
	}
	_ = tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
