package serve

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/meshca/meshca/ca/leader"
	"github.com/meshca/meshca/ca/leader/leaderprom"
	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/keymgr/secretstore"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
)

// RotatorLease is the Lease the replicas sharing a CA state Secret elect
// the one that takes automatic rotation steps on.
const RotatorLease = "meshca-root-rotator"

// leaderIdentity names this replica in a Lease: its host name (the Pod's)
// and a random suffix, unique across restarts.
func leaderIdentity() string {
	host, _ := os.Hostname()
	return host + "-" + rand.String(6)
}

// campaign runs run while this replica holds the Lease namespace/lease,
// and campaigns again when it loses it, until ctx ends: losing a lease
// stops the work that needs it, never the CA. A run that steps down
// (trust.ErrStale: the published bundle is newer than this replica's, or
// of another CA state) releases the Lease to a replica that may be
// current, and this one campaigns again after StepDownBackoff. It returns
// run's own error otherwise. leaders shows whether this replica leads.
func campaign(ctx context.Context, client kubernetes.Interface, namespace, lease string, run func(context.Context) error,
	leaders *leaderprom.Metrics, log *slog.Logger) error {
	identity := leaderIdentity()
	leading := leaders.Lease(lease)
	backoff := StepDownBackoff
	for {
		err := leader.Run(ctx, client, namespace, lease, identity, run, log, leading)
		stale := errors.Is(err, trust.ErrStale)
		switch {
		case ctx.Err() != nil && (stale || errors.Is(err, leader.ErrLeadershipLost)):
			return nil // stopping: how the last term ended does not matter
		case ctx.Err() != nil:
			return err
		case errors.Is(err, leader.ErrLeadershipLost):
			log.Warn("leadership lost; campaigning again", "lease", namespace+"/"+lease)
		case stale:
			log.Warn("stepped down: the published trust bundle is not this replica's to replace; campaigning again later",
				"lease", namespace+"/"+lease, "after", backoff.String(), "error", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			// Each term relists the cluster's namespaces and ConfigMaps:
			// a replica that stays behind comes back ever more slowly.
			backoff = min(2*backoff, maxStepDownBackoff)
			continue
		default:
			return err
		}
		backoff = StepDownBackoff
	}
}

// StepDownBackoff is how long a replica that stepped down waits before it
// campaigns again, the first time: long enough for a current replica to
// take the Lease (within leader.RetryPeriod), short enough that a replica
// that has caught up, or the only one, publishes again soon. It doubles
// with each step-down in a row, up to maxStepDownBackoff.
const StepDownBackoff = 30 * time.Second

const maxStepDownBackoff = 5 * time.Minute

// electedOn makes run, the automatic rotation loop, run on one replica
// at a time when the CA state is a Secret that replicas share; on a
// state directory, which only this process (and the CLI) can reach, run
// is returned as it is.
func electedOn(store any, run func(context.Context) error, leaders *leaderprom.Metrics, log *slog.Logger) func(context.Context) error {
	s, ok := store.(*secretstore.Store)
	if !ok {
		return run
	}
	return func(ctx context.Context) error {
		return campaign(ctx, s.Client, s.Namespace, RotatorLease, run, leaders, log)
	}
}
