package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/spf13/cobra"
)

// stepFlags are those of the guarded steps, activate and retire.
type stepFlags struct {
	store  storeFlags
	signer rootSignerFlags
	force  bool
	reason string
	margin time.Duration
	audit  auditFlags
	// istiod is --istiod-cert-secret; dependents what it holds, read
	// once before the step.
	istiod     string
	dependents []keymgr.Dependent
	// retire's --destroy-root-key, and the upstream that keeps the key.
	destroyRootKey bool
	up             upstreamFlags
}

// guards are the step's guards: the margin, and istiod's certificate.
func (f *stepFlags) guards() keymgr.Guards {
	return keymgr.Guards{Margin: f.margin, Dependents: f.dependents}
}

func newRootActivateCommand() *cobra.Command {
	return newRootStepCommand("activate [ID]", "Make a prepared authority sign; the active one becomes previous",
		"activate is refused until the prepared root has been in the served bundle for half the longest\n"+
			"leaf lifetime issued under the active authority, plus --margin: by then every workload has renewed\n"+
			"once and trusts the new root; and, with --istiod-cert-secret, until istiod's ca.crt holds it. The\n"+
			"refusal says when it becomes safe.",
		keymgr.PhasePrepared, func(s *keymgr.State, id string, now time.Time, f *stepFlags) error {
			return s.Activate(id, now, f.guards(), f.force, f.reasonOr("activated by meshca root activate"))
		}, rootBackend.activate, nil)
}

func newRootRetireCommand() *cobra.Command {
	return newRootStepCommand("retire [ID]", "Drop a previous authority from the bundle and destroy its key",
		"retire is refused while leaves issued under the authority can still be valid, and for --margin\n"+
			"after the last one expires (for clocks that disagree); and, with --istiod-cert-secret, while istiod's\n"+
			"certificate chains only to its root. The refusal says when it becomes safe.",
		keymgr.PhasePrevious, func(s *keymgr.State, id string, now time.Time, f *stepFlags) error {
			return s.Retire(id, now, f.guards(), f.force, f.reasonOr("retired by meshca root retire"))
		}, rootBackend.retire, (*stepFlags).registerDestroy)
}

// stepFunc takes a step on the authority id of s.
type stepFunc func(s *keymgr.State, id string, now time.Time, f *stepFlags) error

// newRootStepCommand builds a guarded step on the authority named by its
// argument, or on the only one in phase when none is named. With an
// external signer, the step is first tried on a copy of the state (its
// guard decides), then taken in the backend, then recorded.
func newRootStepCommand(use, short, long string, phase keymgr.Phase, step stepFunc,
	inBackend func(rootBackend, context.Context, *keymgr.State, *keymgr.AuthorityRecord) error, extra func(*stepFlags, *cobra.Command)) *cobra.Command {
	f := &stepFlags{}
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long + "\n--force overrides the guard, only with --reason; both are recorded.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.run(cmd, args, phase, step, inBackend)
		},
	}
	f.store.register(cmd)
	f.signer.register(cmd.Flags(), cmd.Name())
	cmd.Flags().BoolVar(&f.force, "force", false, "override the guard (requires --reason)")
	cmd.Flags().StringVar(&f.reason, "reason", "", "why, for the history and the audit log")
	cmd.Flags().StringVar(&f.istiod, "istiod-cert-secret", "", "istiod's certificate Secret, namespace/name, as meshca serve --istiod-cert-secret: the step waits until istiod trusts the root it makes sign (activate) and its certificate chains to a root that stays (retire)")
	cmd.Flags().DurationVar(&f.margin, "margin", keymgr.DefaultGuardMargin, "margin the guard adds: activate waits half the longest leaf lifetime plus it, retire the last leaf's expiry plus it")
	f.audit.register(cmd.Flags(), "standard error")
	if extra != nil {
		extra(f, cmd)
	}
	return cmd
}

// run takes the step cmd names on the authority args name: tried and
// taken in an external backend first, then recorded in the CA state,
// audited and reported.
func (f *stepFlags) run(cmd *cobra.Command, args []string, phase keymgr.Phase, step stepFunc,
	inBackend func(rootBackend, context.Context, *keymgr.State, *keymgr.AuthorityRecord) error) error {
	if f.force && f.reason == "" {
		return &exitError{code: exitUsage, err: errors.New("--force needs --reason: say why the guard is overridden")}
	}
	audit, err := f.audit.stepAuditor(cmd, f.signer.signer)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	defer audit.close()
	ctx, cancel := contextWithTimeout(cmd, 60*time.Second)
	defer cancel()
	store, notice, be, err := f.open(ctx, cmd)
	if err != nil {
		return err
	}
	plan, err := f.planDestroy(ctx, store, args, phase, step, slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil)))
	if err != nil {
		audit.step(ctx, cmd.Name(), "", f.force, f.reason, err)
		return rootError(err)
	}
	var id string
	if _, local := be.(localRoot); !local {
		if id, err = tryStep(ctx, store, args, phase, step, f, func(s *keymgr.State, rec *keymgr.AuthorityRecord) error {
			return inBackend(be, ctx, s, rec)
		}); err != nil {
			audit.step(ctx, cmd.Name(), id, f.force, f.reason, err)
			return rootError(err)
		}
	}
	st, err := keymgr.Update(ctx, store, func(s *keymgr.State) error {
		rec, err := pick(s, args, phase)
		if err != nil {
			return &exitError{code: exitUsage, err: err}
		}
		id = rec.ID()
		return step(s, id, time.Now(), f)
	})
	if err != nil {
		audit.step(ctx, cmd.Name(), id, f.force, f.reason, err)
		return rootError(err)
	}
	audit.step(ctx, cmd.Name(), id, f.force, f.reason, nil)
	tell(cmd.ErrOrStderr(), notice)
	rec, _ := st.View().Lookup(id)
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s; bundle sequence %d\n", rec.Phase, shortID(rec), st.Sequence)
	return plan.destroy(ctx, st, cmd.OutOrStdout())
}

// open opens the CA state for the step, reads what istiod's certificate
// holds, finishes on a state directory a step a crash cut short, and
// returns the signer's side of the step.
func (f *stepFlags) open(ctx context.Context, cmd *cobra.Command) (keymgr.StateStore, string, rootBackend, error) {
	store, notice, err := f.store.openForStep(ctx)
	if err != nil {
		return nil, "", nil, err
	}
	if f.dependents, err = f.store.dependents(ctx, f.istiod); err != nil {
		return nil, "", nil, &exitError{code: exitUsage, err: err}
	}
	if d, ok := store.(*dirstore.Store); ok {
		// Finish a step a crash cut short after its commit (a retired
		// key left on disk), even if this one is refused.
		if err := d.Tidy(ctx); err != nil {
			return nil, "", nil, &exitError{code: exitUsage, err: err}
		}
	}
	f.signer.out = cmd.OutOrStdout()
	be, err := f.signer.backend(ctx)
	if err != nil {
		return nil, "", nil, &exitError{code: exitUsage, err: err}
	}
	return store, notice, be, nil
}

// tryStep takes the step on a copy of the stored state and, if the state
// allows it, in the backend (do, given the state as it is before the
// step); it returns the authority's id.
func tryStep(ctx context.Context, store keymgr.StateStore, args []string, phase keymgr.Phase, step stepFunc, f *stepFlags,
	do func(*keymgr.State, *keymgr.AuthorityRecord) error) (string, error) {
	cur, _, err := store.Load(ctx)
	if err != nil {
		return "", err
	}
	if err := validStored(cur); err != nil {
		return "", err
	}
	rec, err := pick(cur, args, phase)
	if err != nil {
		return "", &exitError{code: exitUsage, err: err}
	}
	if err := step(cur.Clone(), rec.ID(), time.Now(), f); err != nil {
		return rec.ID(), err
	}
	return rec.ID(), do(cur, rec)
}

func (f *stepFlags) reasonOr(def string) string {
	if f.reason != "" {
		return f.reason
	}
	return def
}

// pick is the authority args name, or the only one in phase.
func pick(s *keymgr.State, args []string, phase keymgr.Phase) (*keymgr.AuthorityRecord, error) {
	if len(args) == 1 {
		return s.View().Lookup(args[0])
	}
	var found []*keymgr.AuthorityRecord
	for _, a := range s.Authorities {
		if a.Phase == phase {
			found = append(found, a)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, fmt.Errorf("no %s authority: see meshca root status", phase)
	}
	return nil, fmt.Errorf("%d authorities are %s: name one (meshca root status lists them)", len(found), phase)
}
