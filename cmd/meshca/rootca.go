package main

import (
	"context"
	"errors"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/cobra"
)

func newRootCACommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "root",
		Short: "Inspect the CA's roots",
	}
	cmd.AddCommand(newRootBundleCommand())
	return cmd
}

func newRootBundleCommand() *cobra.Command {
	var stateDir, caDir string
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Print the trust bundle (every trusted root) as PEM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := stateDir
			if (stateDir == "") == (caDir == "") {
				return errors.New("give exactly one of --state-dir and --ca-dir")
			}
			if caDir != "" {
				dir = caDir
			}
			a, err := keymgr.LoadCACerts(dir, time.Now())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(pemutil.EncodeCertificates(a.Roots...))
			return err
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "state directory of a self-signed meshca CA")
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "plugged-in CA directory")
	return cmd
}

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}
