package trust

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The Lease timings, client-go's customary ones: a leader that stops
// renewing is replaced after at most LeaseDuration; a released lease is
// taken within about RetryPeriod.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// ErrLeadershipLost is returned by RunLeaderElected when the lease was
// lost (not renewed in time) while ctx was still live. The work run under
// it has been stopped; the caller campaigns again with fresh work (a
// Publisher runs once), and keeps everything else running: meshca's
// replicas keep serving certificates without the Lease.
var ErrLeadershipLost = errors.New("trust: leadership lost")

// RunLeaderElected campaigns for the Lease namespace/leaseName as
// identity and, while it leads, runs run with a context that ends when
// leadership ends. It blocks until ctx ends (nil), run returns (run's
// error; the lease is released), or leadership is lost
// (ErrLeadershipLost). The lease is released when ctx ends, so another
// candidate takes over within about RetryPeriod.
//
// Each of observe hears true when this candidate starts leading and
// false when it stops (and at the end, whether it led or not): metrics of
// leadership.
func RunLeaderElected(ctx context.Context, client kubernetes.Interface, namespace, leaseName, identity string,
	run func(context.Context) error, log *slog.Logger, observe ...func(leading bool)) error {
	switch {
	case client == nil:
		return errors.New("trust: leader election: client is required")
	case namespace == "" || leaseName == "":
		return errors.New("trust: leader election: lease namespace and name are required")
	case identity == "":
		return errors.New("trust: leader election: identity is required")
	case run == nil:
		return errors.New("trust: leader election: run is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With(logLease, namespace+"/"+leaseName, logIdentity, identity)
	leading := func(b bool) {
		for _, o := range observe {
			o(b)
		}
	}
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// state hands run over between the elector's goroutine and this one:
	// once le.Run has returned, run either started (wait for it) or never
	// will.
	var state atomic.Int32
	runDone := make(chan runResult, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: leaseName},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		},
		LeaseDuration:   LeaseDuration,
		RenewDeadline:   RenewDeadline,
		RetryPeriod:     RetryPeriod,
		ReleaseOnCancel: true,
		Name:            leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				if !state.CompareAndSwap(stateIdle, stateRunning) {
					return
				}
				log.Info("leading")
				leading(true)
				err := run(lctx)
				// Also here: OnStoppedLeading may have come before this
				// goroutine said true.
				leading(false)
				runDone <- runResult{err: err, byItself: lctx.Err() == nil}
				cancel() // release the lease when run stops by itself
			},
			OnStoppedLeading: func() { leading(false) },
			OnNewLeader: func(id string) {
				if id != identity {
					log.Info("following", logLeader, id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("trust: leader election: %w", err)
	}
	le.Run(ctx)
	if state.CompareAndSwap(stateIdle, stateClosed) {
		return nil // never led; ctx ended
	}
	r := <-runDone
	log.Info("stopped leading")
	switch {
	case r.err != nil && (r.byItself || !errors.Is(r.err, context.Canceled)):
		return r.err
	case r.byItself, outer.Err() != nil:
		return nil
	}
	return ErrLeadershipLost
}

const (
	stateIdle int32 = iota
	stateRunning
	stateClosed
)

type runResult struct {
	err      error
	byItself bool // run returned while it still led
}
