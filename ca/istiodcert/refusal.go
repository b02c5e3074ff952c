package istiodcert

import "context"

// Refusal returns why the keeper leaves the Secret alone now: a
// *RefusedError while it is another owner's, nil while the keeper may
// write it or does not run (another replica leads).
func (k *Keeper) Refusal() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refusal == nil {
		return nil
	}
	return k.refusal
}

// refuse records r (nil: the Secret may be written), tells the observer,
// and logs a change: a warning when a refusal starts or names another
// owner, a line when it ends.
func (k *Keeper) refuse(ctx context.Context, r *RefusedError) {
	k.mu.Lock()
	prev := k.refusal
	k.refusal = r
	k.mu.Unlock()
	if k.c.Observe != nil {
		reason := ""
		if r != nil {
			reason = r.Reason
		}
		k.c.Observe.Refused(reason)
	}
	switch {
	case r != nil && (prev == nil || prev.Error() != r.Error()):
		k.c.Logger.WarnContext(ctx, "istiod certificate Secret refused: another owner has it", "secret", r.Secret, "refused", r.Reason,
			"owner", r.Owner, "error", r.Error())
	case r == nil && prev != nil:
		k.c.Logger.InfoContext(ctx, "istiod certificate Secret may be written again", "secret", prev.Secret, "was_refused", prev.Reason)
	}
}

// forget clears the refusal when the keeper stops (it lost its Lease):
// the replica that keeps the Secret next tells.
func (k *Keeper) forget() {
	k.mu.Lock()
	k.refusal = nil
	k.mu.Unlock()
	if k.c.Observe != nil {
		k.c.Observe.Refused("")
	}
}
