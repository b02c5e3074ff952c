package keymgr

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshca/meshca/keymgr/upstream"
)

// maxUpdateAttempts bounds how often Update redoes a change that lost a
// race to another writer.
const maxUpdateAttempts = 8

// Update applies change to the stored state and saves the result with
// compare-and-swap. When another writer saved first, it loads the new
// state and applies change to that, never overwriting what the other
// wrote. change gets a copy it may modify; an error from it (a guard's
// refusal, say) is returned as it is and nothing is saved. With no state
// stored, change gets an empty State.
func Update(ctx context.Context, store StateStore, change func(*State) error) (*State, error) {
	for range maxUpdateAttempts {
		s, v, err := store.Load(ctx)
		switch {
		case errors.Is(err, ErrNoState):
			s, v = &State{}, ""
		case err != nil:
			return nil, err
		}
		next := s.Clone()
		if err := change(next); err != nil {
			return nil, err
		}
		if err := next.Validate(); err != nil {
			return nil, fmt.Errorf("keymgr: the changed CA state would be invalid, not saved: %w", err)
		}
		_, err = store.Save(ctx, next, v)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return next, nil
	}
	return nil, fmt.Errorf("keymgr: %d writers in a row saved the CA state first: %w", maxUpdateAttempts, ErrConflict)
}

// LoadOrBootstrap returns the stored state; when none is stored, or it has
// no active authority yet, it stores one whose first authority is the one
// generate makes, active at once. Processes starting together agree on
// one: the losers of the race load the winner's.
func LoadOrBootstrap(ctx context.Context, store StateStore, generate func() (*AuthorityRecord, error), now time.Time) (*State, error) {
	return LoadOrBootstrapDiscarding(ctx, store, generate, nil, now)
}

// LoadOrBootstrapDiscarding is LoadOrBootstrap, which calls generate at
// most once (a compare-and-swap lost is retried with the same authority),
// and hands discard the authority it made when the state did not take
// it (another process bootstrapped first, or the update failed): a root
// made in an upstream would be left there, recorded nowhere. discard's
// error is joined to the result's.
func LoadOrBootstrapDiscarding(ctx context.Context, store StateStore, generate func() (*AuthorityRecord, error),
	discard func(*AuthorityRecord) error, now time.Time) (*State, error) {
	s, _, err := store.Load(ctx)
	switch {
	case err == nil && s.Active() != nil:
		return s, nil
	case err != nil && !errors.Is(err, ErrNoState):
		return nil, err
	}
	errBootstrapped := errors.New("another process bootstrapped first")
	var made *AuthorityRecord
	s, err = Update(ctx, store, func(s *State) error {
		if s.Active() != nil {
			return errBootstrapped
		}
		if made == nil {
			rec, err := generate()
			if err != nil {
				return err
			}
			made = rec
		}
		// A copy for each attempt: Bootstrap writes its history.
		rec := *made
		rec.History = nil
		return s.Bootstrap(&rec, now, "generated on first start")
	})
	if errors.Is(err, errBootstrapped) {
		s, _, err = store.Load(ctx)
	}
	if made == nil || discard == nil || err == nil && holds(s, made) {
		return s, err
	}
	// A failed update may still have been stored (its answer lost): the
	// store, read again, decides; unread, the key is kept.
	if unrecorded, uerr := Unrecorded(ctx, store, made); uerr != nil {
		err = errors.Join(err, uerr)
	} else if unrecorded {
		if derr := discard(made); derr != nil {
			err = errors.Join(err, derr)
		}
	}
	return s, err
}

// Unrecorded reports whether the state in store, read now, holds no
// authority of rec's certificate (nor of its root, for a root key to be
// destroyed): a failed update whose answer was lost may have stored it.
// An error means it could not tell; the caller keeps what rec names. It
// reads even when ctx has ended, within upstream.OrphanTimeout.
func Unrecorded(ctx context.Context, store StateStore, rec *AuthorityRecord) (bool, error) {
	// The update's context may be what ended: the read gets its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upstream.OrphanTimeout)
	defer cancel()
	s, _, err := store.Load(ctx)
	switch {
	case errors.Is(err, ErrNoState):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("keymgr: whether the state holds authority %.16s is unknown (%w): its root's key is kept", rec.ID(), err)
	}
	for _, a := range s.Authorities {
		if a.Cert.Equal(rec.Cert) || a.Root.Equal(rec.Root) {
			return false, nil
		}
	}
	return true, nil
}

// holds reports whether s has an authority whose certificate is rec's.
func holds(s *State, rec *AuthorityRecord) bool {
	if s == nil {
		return false
	}
	for _, a := range s.Authorities {
		if a.Cert.Equal(rec.Cert) {
			return true
		}
	}
	return false
}
