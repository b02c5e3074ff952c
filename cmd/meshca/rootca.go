package main

import (
	"context"
	"crypto/x509"
	"errors"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
)

func newRootCACommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "root",
		Short: "Inspect and rotate the CA's roots: status, prepare, activate, retire, bundle",
		Long: "A root rotation is prepare (the new root joins the trust bundle) → activate (it signs; the old one\n" +
			"becomes previous) → retire (the old root leaves the bundle). Each guarded step waits until it cannot\n" +
			"break a handshake. Exit codes: 0 done, 1 refused by a guard (the message says when it becomes safe),\n" +
			"2 usage or state error.",
	}
	cmd.AddCommand(newRootStatusCommand(), newRootPrepareCommand(), newRootActivateCommand(), newRootRetireCommand(), newRootBundleCommand())
	return cmd
}

func newRootBundleCommand() *cobra.Command {
	var (
		store storeFlags
		caDir string
	)
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Print the trust bundle (every trusted root) as PEM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := contextWithTimeout(cmd, 30*time.Second)
			defer cancel()
			var roots []*x509.Certificate
			if caDir != "" {
				if store.stateDir != "" || store.stateSecret != "" {
					return &exitError{code: exitUsage, err: errors.New("give one of --state-dir, --state-secret and --ca-dir")}
				}
				a, err := keymgr.LoadCACerts(caDir, time.Now())
				if err != nil {
					return &exitError{code: exitUsage, err: err}
				}
				roots = a.Roots
			} else {
				st, err := store.load(ctx)
				if err != nil {
					return err
				}
				roots = st.Bundle()
			}
			_, err := cmd.OutOrStdout().Write(pemutil.EncodeCertificates(roots...))
			return err
		},
	}
	store.register(cmd)
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "plugged-in CA directory")
	return cmd
}

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}
