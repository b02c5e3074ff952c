// Package leader runs work on one replica at a time: Run campaigns for a
// Lease and runs the work while this replica holds it. The controllers
// run under it (trust publishers, podcert, the istiod certificate
// keeper, the rotator) share its run-once guard and work queue (Once,
// NewQueue). Its metric is in leaderprom.
package leader

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

// ErrLeadershipLost is returned by Run when the lease was
// lost (not renewed in time) while ctx was still live. The work run under
// it has been stopped; the caller campaigns again with fresh work (a
// Publisher runs once), and keeps everything else running: meshca's
// replicas keep serving certificates without the Lease.
var ErrLeadershipLost = errors.New("leader: leadership lost")

// Run campaigns for the Lease namespace/leaseName as
// identity and, while it leads, runs run with a context that ends when
// leadership ends or ctx does. It blocks until ctx ends (nil), run returns
// (run's error; the lease is released), or leadership is lost
// (ErrLeadershipLost). When ctx ends, the lease is released once run has
// returned, and renewed until then: the work in flight finishes (a
// certificate signed is delivered) before another candidate, which takes
// over within about RetryPeriod, starts beside it.
//
// Each of observe hears true when this candidate starts leading and
// false when it stops (and at the end, whether it led or not): metrics of
// leadership.
func Run(ctx context.Context, client kubernetes.Interface, namespace, leaseName, identity string,
	run func(context.Context) error, log *slog.Logger, observe ...func(leading bool)) error {
	switch {
	case client == nil:
		return errors.New("leader: leader election: client is required")
	case namespace == "" || leaseName == "":
		return errors.New("leader: leader election: lease namespace and name are required")
	case identity == "":
		return errors.New("leader: leader election: identity is required")
	case run == nil:
		return errors.New("leader: leader election: run is required")
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
	// The elector's context outlives ctx while run winds down: it ends
	// when run has returned or, when this candidate does not lead, when
	// ctx ends.
	ctx, cancel := context.WithCancel(context.WithoutCancel(outer))
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
				rctx, stop := context.WithCancel(lctx)
				unhook := context.AfterFunc(outer, stop)
				err := run(rctx)
				unhook()
				stop()
				// Also here: OnStoppedLeading may have come before this
				// goroutine said true.
				leading(false)
				runDone <- runResult{err: err, byItself: lctx.Err() == nil && outer.Err() == nil}
				cancel() // release the lease: run has stopped
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
		return fmt.Errorf("leader: leader election: %w", err)
	}
	unhook := context.AfterFunc(outer, func() {
		if state.CompareAndSwap(stateIdle, stateClosed) {
			cancel() // not leading: stop campaigning now
		}
	})
	defer unhook()
	le.Run(ctx)
	if state.CompareAndSwap(stateIdle, stateClosed) || state.Load() == stateClosed {
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
