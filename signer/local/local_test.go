package local_test

import (
	"testing"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer"
	"github.com/meshca/meshca/signer/local"
	"github.com/meshca/meshca/signer/signertest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

func TestContract(t *testing.T) {
	signertest.Run(t, signertest.Backend{
		New: func(t testing.TB, ca *keymgr.Authority) signer.Signer {
			return local.New(local.Config{Authorities: keymgr.NewManager(spiffeid.RequireTrustDomainFromString("cluster.local"), ca)})
		},
	})
}
