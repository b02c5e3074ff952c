package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/dirstore"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
)

// Exit codes of `meshca root` steps.
const (
	exitRefused = 1 // a guard refused; the message says when the step becomes safe
	exitUsage   = 2 // bad flags, or a step that cannot apply to this state
)

// exitError carries the process exit code of an error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// exitCode is the process exit code of err: a guard's refusal is 1, a
// usage or state error of `meshca root` is 2, anything else 1.
func exitCode(err error) int {
	var (
		ee *exitError
		ge *keymgr.GuardError
	)
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ge):
		return exitRefused
	}
	return 1
}

// rootError gives a failed rotation step its exit code: 1 for a guard's
// refusal, 2 for anything else (usage, state, store).
func rootError(err error) error {
	var (
		ee *exitError
		ge *keymgr.GuardError
	)
	switch {
	case err == nil, errors.As(err, &ee):
		return err
	case errors.As(err, &ge):
		return &exitError{code: exitRefused, err: err}
	}
	return &exitError{code: exitUsage, err: err}
}

// storeFlags name the CA state a `meshca root` command works on.
type storeFlags struct {
	stateDir    string
	stateSecret string
	cluster     clusterFlags
	maxTTL      time.Duration
}

func (s *storeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.stateDir, "state-dir", "", "the CA state directory (as meshca serve --state-dir)")
	cmd.Flags().StringVar(&s.stateSecret, "state-secret", "", "the CA state Secret, namespace/name (as meshca serve --state-secret)")
	s.cluster.register(cmd.Flags(), "--state-secret and --istiod-cert-secret")
	cmd.Flags().DurationVar(&s.maxTTL, "max-ttl", ca.DefaultMaxTTL, "a --state-dir still in the single-root layout of an earlier meshca: its server's --max-ttl; "+
		"the guards assume leaves that long were issued under its roots")
}

// open returns the store the flags name.
func (s *storeFlags) open() (keymgr.StateStore, error) {
	switch {
	case (s.stateDir == "") == (s.stateSecret == ""):
		return nil, errors.New("give the CA state with --state-dir or with --state-secret, one of them")
	case s.stateDir != "":
		return &dirstore.Store{Dir: s.stateDir, MigrationTTL: s.maxTTL}, nil
	}
	ns, name, ok := strings.Cut(s.stateSecret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--state-secret %q: want namespace/name", s.stateSecret)
	}
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	return &secretstore.Store{Client: client, Namespace: ns, Name: name}, nil
}

// client is the Kubernetes client of the cluster the flags find.
func (s *storeFlags) client() (kubernetes.Interface, error) { return s.cluster.client() }

// dependents reads istiod's certificate from the Secret namespace/name
// (--istiod-cert-secret) for the guards; none when secret is empty.
func (s *storeFlags) dependents(ctx context.Context, secret string) ([]keymgr.Dependent, error) {
	if secret == "" {
		return nil, nil
	}
	ns, name, ok := strings.Cut(secret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--istiod-cert-secret %q: want namespace/name", secret)
	}
	client, err := s.client()
	if err != nil {
		return nil, err
	}
	return []keymgr.Dependent{istiodcert.Read(ctx, client, ns, name)}, nil
}

// openForStep returns the store the flags name, for a step that saves,
// and, when that save migrates a directory of the single-root layout
// (recording leaves of up to --max-ttl under its roots), what to tell the
// operator once it is done.
func (s *storeFlags) openForStep(ctx context.Context) (keymgr.StateStore, string, error) {
	store, err := s.open()
	if err != nil {
		return nil, "", &exitError{code: exitUsage, err: err}
	}
	var notice string
	if old, err := dirstore.Unmigrated(ctx, store); err == nil && old {
		notice = fmt.Sprintf("migrated %s from the single-root layout: the guards assume leaves of up to %s (--max-ttl) were issued under its roots",
			s.stateDir, s.maxTTL)
	}
	return store, notice, nil
}

// validStored refuses a stored state that does not validate, before an
// external backend is changed for a step that Update would then refuse to
// save.
func validStored(s *keymgr.State) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("the stored CA state is invalid, nothing changed: %w", err)
	}
	return nil
}

// tell writes notice, if any, to w.
func tell(w io.Writer, notice string) {
	if notice != "" {
		fmt.Fprintln(w, notice)
	}
}

// load reads the state, for commands that only look.
func (s *storeFlags) load(ctx context.Context) (*keymgr.State, error) {
	store, err := s.open()
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	st, _, err := store.Load(ctx)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: err}
	}
	return st, nil
}
