package leader

import (
	"errors"
	"sync"

	"k8s.io/client-go/util/workqueue"
)

// Once is the guard of a controller's Run, which a controller runs once
// (under Run, a controller that loses its Lease is built again): the
// first Start succeeds, every later one fails.
type Once struct {
	mu      sync.Mutex
	started bool
}

// Start marks the controller started; it returns an error saying what
// when it was already, "<what> already started".
func (o *Once) Start(what string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started {
		return errors.New(what + " already started")
	}
	o.started = true
	return nil
}

// NewQueue returns a controller's work queue of keys, with client-go's
// default controller rate limits; name names its metrics, "" none.
func NewQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}
