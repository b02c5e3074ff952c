// Package signers runs the signer contract suite and end-to-end issuance
// against the real external CA servers (cfssl serve, Vault).
package signers

import (
	"fmt"
	"os"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

var (
	cluster  *harness.Cluster
	bin      string
	cfsslBin string
	vaultBin string
)

func TestMain(m *testing.M) {
	var err error
	if cfsslBin, err = harness.CfsslBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real cfssl is required for these tests:", err)
		os.Exit(1)
	}
	if vaultBin, err = harness.VaultBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the real Vault is required for these tests:", err)
		os.Exit(1)
	}
	os.Exit(harness.Main(m, func(c *harness.Cluster, meshca string) { cluster, bin = c, meshca }))
}
