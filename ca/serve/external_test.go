package serve_test

import (
	"context"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/signer/local"
)

// external is an External of the tests: the built-in signer under issuer,
// standing for a backend the command describes, refusing what it is told
// to. The real ones (cfssl, Vault, k8scsr) are in cmd/meshca and run
// against real servers in integration/.
type external struct {
	name   string
	issuer *testca.CA
	// holdsKey: Opened.CA is issuer's, as for cfssl in process.
	holdsKey bool
	// istiod and pods are what IstiodCert and PodCertificates answer;
	// open, when set, what Open fails with.
	istiod, pods, open error
}

func (e *external) Name() string           { return e.name }
func (e *external) IstiodCert() error      { return e.istiod }
func (e *external) PodCertificates() error { return e.pods }

func (e *external) Open(_ context.Context, env serve.ExternalEnv) (*serve.Opened, error) {
	if e.open != nil {
		return nil, e.open
	}
	a := e.issuer.Authority(e.issuer.Root().Cert)
	o := &serve.Opened{Signer: local.New(local.Config{Authorities: keymgr.NewManager(env.TrustDomain, a)}), Remote: !e.holdsKey}
	if e.holdsKey {
		o.CA = a
	}
	return o, nil
}
