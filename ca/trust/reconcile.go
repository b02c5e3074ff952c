package trust

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// WriteError is a create or update of one namespace's ConfigMap (or the
// read before an update) that failed and will be retried.
type WriteError struct {
	Namespace string
	Name      string // the ConfigMap's
	Op        string // "create", "get" or "update"
	Err       error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("trust: %s ConfigMap %s/%s: %v", e.Op, e.Namespace, e.Name, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// Wants reports whether a namespace should carry the ConfigMap: not
// skipped by name, matching the selector, and not terminating.
func (p *Publisher) Wants(ns *corev1.Namespace) bool {
	switch {
	case p.skip[ns.Name]:
		return false
	case ns.Status.Phase == corev1.NamespaceTerminating, ns.DeletionTimestamp != nil:
		return false
	case !p.cfg.Selector.Matches(labels.Set(ns.Labels)):
		return false
	}
	return true
}

// reconcile brings one namespace's ConfigMap in line with the bundle. A
// returned error means: try again later.
func (p *Publisher) reconcile(ctx context.Context, name string) error {
	ns, err := p.namespaces.Get(name)
	if apierrors.IsNotFound(err) {
		return nil // deleted; its ConfigMap goes with it
	}
	if err != nil {
		return err
	}
	if !p.Wants(ns) {
		return nil
	}
	bundle := p.cfg.Bundle()
	if len(bundle.PEM) == 0 {
		return nil // nothing to publish yet; BundleChanged will queue it again
	}
	// Asked before anything is compared: a term that finds every
	// namespace up to date still records the version it serves, so that
	// a replica behind it, or of another CA state, leading later, is held
	// back (the answer is remembered: no apiserver call after the first).
	if ok, err := p.guard(ctx, bundle, name); !ok {
		return err
	}
	cm, err := p.configMaps.ConfigMaps(name).Get(p.cfg.Document.Name)
	switch {
	case apierrors.IsNotFound(err):
		err = p.create(ctx, name, bundle)
	case err != nil:
		return err
	case !current(cm, bundle):
		err = p.update(ctx, cm, bundle)
	}
	if err == nil {
		p.published(bundle.PEM)
	}
	return err
}

// published tells Config.Published of pem, when set.
func (p *Publisher) published(pem []byte) {
	if p.cfg.Published != nil {
		p.cfg.Published(pem)
	}
}

// guard asks the Mark whether bundle may be written (staleWarning.guard):
// not over a newer bundle of its lineage, nor over another lineage's.
func (p *Publisher) guard(ctx context.Context, bundle Bundle, ns string) (bool, error) {
	return p.stale.guard(ctx, p.cfg.Mark, bundle.Version, p.cfg.Logger, p.observe, logNamespace, ns)
}

func (p *Publisher) create(ctx context.Context, ns string, bundle Bundle) error {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: p.cfg.Document.Name, Namespace: ns,
			Labels: map[string]string{LabelKey: LabelValue}, Annotations: bundle.Version.annotate(nil)},
		Data: map[string]string{p.cfg.Document.Key: string(bundle.PEM)},
	}
	_, err := p.cfg.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	switch {
	case err == nil:
		p.observe(ResultCreated)
		return nil
	case apierrors.IsAlreadyExists(err):
		// The informer has not seen it yet; its add event queues the
		// namespace again and the update path compares it.
		p.observe(ResultConflict)
		return nil
	case apierrors.IsNotFound(err), apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return nil // the namespace went away or is going
	case apierrors.IsForbidden(err):
		p.observe(ResultForbidden)
		p.cfg.Logger.Warn("not allowed to create the published ConfigMap",
			logName, p.cfg.Document.Name, logNamespace, ns, logError, err.Error())
		return nil // a resync tries again, should RBAC change
	}
	p.observe(ResultError)
	return &WriteError{Namespace: ns, Name: p.cfg.Document.Name, Op: "create", Err: err}
}

// update writes bundle over the ConfigMap s summarizes (see summarize
// and written): from the summary itself, which holds all an update
// keeps, unless others' metadata is to be kept (cacheForeignMeta): the
// ConfigMap is then read first and its metadata written back (the read,
// unlike the cache, holds a tenant's padding only until the write).
func (p *Publisher) update(ctx context.Context, s *corev1.ConfigMap, bundle Bundle) error {
	cms := p.cfg.Client.CoreV1().ConfigMaps(s.Namespace)
	base := s
	if s.Annotations[cacheForeignMeta] != "" {
		live, err := cms.Get(ctx, p.cfg.Document.Name, metav1.GetOptions{})
		if err != nil {
			return p.updateResult(s.Namespace, "get", err)
		}
		base = live
	}
	_, err := cms.Update(ctx, p.cfg.Document.written(base, bundle), metav1.UpdateOptions{})
	return p.updateResult(s.Namespace, "update", err)
}

// updateResult counts and logs the result of update's op (err may be nil)
// and returns what reconcile does.
func (p *Publisher) updateResult(ns, op string, err error) error {
	switch {
	case err == nil:
		p.observe(ResultUpdated)
		return nil
	case apierrors.IsNotFound(err):
		// Deleted meanwhile: its delete event queues the namespace again.
		return nil
	case apierrors.IsConflict(err):
		// Our cached copy is stale; retry on the next one.
		p.observe(ResultConflict)
		return &WriteError{Namespace: ns, Name: p.cfg.Document.Name, Op: op, Err: err}
	case apierrors.IsForbidden(err):
		p.observe(ResultForbidden)
		p.cfg.Logger.Warn("not allowed to "+op+" the published ConfigMap",
			logName, p.cfg.Document.Name, logNamespace, ns, logError, err.Error())
		return nil
	}
	p.observe(ResultError)
	return &WriteError{Namespace: ns, Name: p.cfg.Document.Name, Op: op, Err: err}
}

func (p *Publisher) observe(result string) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.ObserveWrite(result)
	}
}
