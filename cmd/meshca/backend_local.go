package main

import (
	"context"
	"io"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/pflag"
)

// signerLocal is the built-in CA, the default signer: its keys are in the
// CA state (--state-dir, --state-secret) or a plugged-in CA (--ca-dir),
// which serve's own flags name.
const signerLocal = serve.BackendLocal

func init() {
	registerSigner(&signerBackend{
		name: signerLocal, usage: "local (built-in CA)",
		root: func() rootOptions { return localRootOptions{} }, rootUsage: "local (built-in CA, keys in the CA state)",
		ownCA: true,
	})
}

// localRootOptions: the built-in CA takes no flags of its own in a step.
type localRootOptions struct{}

func (localRootOptions) register(*pflag.FlagSet, string) {}

func (localRootOptions) open(context.Context, io.Writer) (rootBackend, error) {
	return localRoot{}, nil
}

// localRoot is the built-in CA: every step is the CA state's alone.
type localRoot struct{}

func (localRoot) prepare(context.Context, *keymgr.State, *prepareFlags) (*keymgr.AuthorityRecord, error) {
	return nil, nil
}
func (localRoot) activate(context.Context, *keymgr.State, *keymgr.AuthorityRecord) error { return nil }
func (localRoot) retire(context.Context, *keymgr.State, *keymgr.AuthorityRecord) error   { return nil }
