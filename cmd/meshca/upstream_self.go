package main

import (
	"context"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
)

// The self upstream: the root's key is in the CA state, beside the root,
// and signs each intermediate in process. It has no flags of its own.
func init() {
	registerUpstream(&upstreamKind{
		name: self.Name, usage: "self (the root's key in the CA state signs the intermediate)",
		opener: func() serve.UpstreamOpener { return selfOpener{} },
	})
}

// selfOpener is the self upstream as the assembly opens it.
type selfOpener struct{}

func (selfOpener) Name() string { return self.Name }

func (selfOpener) Open(context.Context, serve.UpstreamEnv) (upstream.Upstream, error) {
	return self.New(), nil
}
