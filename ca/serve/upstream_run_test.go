package serve_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/keymgr/upstream"
	"github.com/meshca/meshca/keymgr/upstream/self"
)

// running is an upstream with a Run loop (as a Vault upstream keeps its
// login alive), which says when it starts and stops.
type running struct {
	*switchable
	started, stopped chan struct{}
}

func (r *running) Run(ctx context.Context) error {
	close(r.started)
	<-ctx.Done()
	close(r.stopped)
	return nil
}

type runningOpener struct{ u *running }

func (o runningOpener) Name() string { return self.Name }

func (o runningOpener) Open(context.Context, serve.UpstreamEnv) (upstream.Upstream, error) {
	return o.u, nil
}

// TestAssembleUpstreamRun: an upstream's Run, when it has one, runs
// beside the server and stops with it.
func TestAssembleUpstreamRun(t *testing.T) {
	c, u, _ := upstreamConfig(t, time.Hour)
	r := &running{switchable: u, started: make(chan struct{}), stopped: make(chan struct{})}
	c.Backend.Upstream.Opener = runningOpener{r}
	ctx, cancel := context.WithCancel(t.Context())
	p, err := serve.Assemble(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-r.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's Run did not start")
	}
	cancel()
	select {
	case <-r.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's Run did not stop with the server")
	}
	<-done
}
