package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/meshca/meshca/keymgr"
	"github.com/spf13/pflag"
)

// rootBackend is the signer's side of a rotation step. The built-in CA
// has none: its keys are in the CA state. Vault holds its keys in issuers
// of its PKI mount, which the steps create, switch and delete; a cfssl
// server's key is changed by its operator, and meshca checks the change.
// Each method runs before the CA state records the step, so that a crash
// in between leaves a state the same step, run again, completes.
type rootBackend interface {
	// prepare creates the authority to add, or returns nil to let the
	// flags build it.
	prepare(ctx context.Context, s *keymgr.State, f *prepareFlags) (*keymgr.AuthorityRecord, error)
	// activate makes rec, an authority of s, sign.
	activate(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error
	// retire destroys rec's key, or says who must; what another authority
	// of s that is not retired still uses is kept.
	retire(ctx context.Context, s *keymgr.State, rec *keymgr.AuthorityRecord) error
}

// rootSignerFlags select the signer whose keys a rotation step changes,
// with each backend's flags of the step.
type rootSignerFlags struct {
	signer string
	opts   map[string]rootOptions
	out    io.Writer
}

// rotatable admits the backends meshca root takes steps with.
func rotatable(b *signerBackend) bool { return b.root != nil }

// register registers the signer flags that apply to step: prepare,
// activate or retire.
func (r *rootSignerFlags) register(fl *pflag.FlagSet, step string) {
	var uses []string
	for _, b := range signerBackends {
		if rotatable(b) {
			uses = append(uses, b.rootUsage)
		}
	}
	fl.StringVar(&r.signer, "signer", signerLocal, "whose keys the step changes: "+strings.Join(uses, ", "))
	r.opts = map[string]rootOptions{}
	for _, b := range signerBackends {
		if rotatable(b) {
			o := b.root()
			o.register(fl, step)
			r.opts[b.name] = o
		}
	}
}

// backend returns the rotation side of the selected signer.
func (r *rootSignerFlags) backend(ctx context.Context) (rootBackend, error) {
	o, ok := r.opts[r.signer]
	if !ok {
		return nil, fmt.Errorf("--signer %q is not one of %s", r.signer, signerNames(rotatable))
	}
	return o.open(ctx, r.out)
}
