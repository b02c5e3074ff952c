package trust

import (
	"context"
	"fmt"
	"log/slog"
	"maps"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// reconcile brings the ClusterTrustBundle in line with the bundle. A
// returned error means: try again later.
func (p *ClusterTrustBundlePublisher) reconcile(ctx context.Context, log *slog.Logger) error {
	bundle := p.cfg.Bundle()
	if len(bundle.PEM) == 0 {
		return nil // nothing to publish yet; BundleChanged will queue it again
	}
	// Asked even when nothing is to be written: see Publisher.reconcile.
	if ok, err := p.stale.guard(ctx, p.cfg.Mark, bundle.Version, log, p.observe); !ok {
		return err
	}
	obj, exists, err := p.store.GetByKey(p.name)
	if err != nil {
		return err
	}
	if !exists {
		return p.write(ctx, log, "create", &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: maps.Clone(p.labels), Annotations: bundle.Version.annotate(nil)},
			Spec:       certv1.ClusterTrustBundleSpec{SignerName: p.cfg.SignerName, TrustBundle: string(bundle.PEM)},
		})
	}
	cur, ok := p.api.toV1(obj)
	if !ok {
		return fmt.Errorf("trust: ClusterTrustBundle cache holds a %T", obj)
	}
	if cur.Labels[LabelManagedBy] != ManagedBy {
		p.observe(ResultNotOwned)
		if !p.warned || p.warnedFor != cur.ResourceVersion {
			p.warned, p.warnedFor = true, cur.ResourceVersion
			log.Warn("a ClusterTrustBundle of that name exists and is not managed by meshca; leaving it alone",
				logLabel, LabelManagedBy+"="+cur.Labels[LabelManagedBy])
		}
		return nil
	}
	want, changed := p.desired(cur, bundle)
	if !changed {
		return nil
	}
	return p.write(ctx, log, "update", want)
}

// desired returns a copy of cur carrying bundle, its version's
// annotations and meshca's labels, and whether that differs from cur.
// Other labels and annotations are kept; the signer name is immutable and
// fixed by the name.
func (p *ClusterTrustBundlePublisher) desired(cur *certv1.ClusterTrustBundle, bundle Bundle) (*certv1.ClusterTrustBundle, bool) {
	changed := cur.Spec.TrustBundle != string(bundle.PEM) || !bundle.Version.annotated(cur.Annotations)
	for k, v := range p.labels {
		changed = changed || cur.Labels[k] != v
	}
	if !changed {
		return cur, false
	}
	want := cur.DeepCopy()
	if want.Labels == nil {
		want.Labels = map[string]string{}
	}
	maps.Copy(want.Labels, p.labels)
	want.Annotations = bundle.Version.annotate(want.Annotations)
	want.Spec.TrustBundle = string(bundle.PEM)
	return want, true
}

// write creates or updates b and sorts the outcome: done, retried soon
// (a conflict, an apiserver error), or retried at the next resync (RBAC,
// validation: logged, as an operator must act).
func (p *ClusterTrustBundlePublisher) write(ctx context.Context, log *slog.Logger, op string, b *certv1.ClusterTrustBundle) error {
	var err error
	if op == "create" {
		err = p.api.create(ctx, p.cfg.Client, b)
	} else {
		err = p.api.update(ctx, p.cfg.Client, b)
	}
	switch {
	case err == nil && op == "create":
		p.observe(ResultCreated)
		return nil
	case err == nil:
		p.observe(ResultUpdated)
		return nil
	case op == "create" && apierrors.IsAlreadyExists(err):
		// The informer has not seen it yet; its add event queues it again.
		p.observe(ResultConflict)
		return nil
	case op == "update" && apierrors.IsNotFound(err):
		return nil // deleted meanwhile: its delete event queues it again
	case apierrors.IsConflict(err):
		p.observe(ResultConflict)
		return fmt.Errorf("trust: %s ClusterTrustBundle %s: %w", op, b.Name, err)
	case apierrors.IsForbidden(err):
		p.observe(ResultForbidden)
		hint := "list, watch, create and update on clustertrustbundles"
		if p.cfg.SignerName != "" {
			hint += ", and attest on the certificates.k8s.io signer " + p.cfg.SignerName
		}
		log.Warn("not allowed to "+op+" the trust bundle ClusterTrustBundle; it needs "+hint,
			logError, err.Error())
		return errRetryAtResync
	case apierrors.IsInvalid(err):
		p.observe(ResultInvalid)
		log.Warn("the apiserver refused the trust bundle ClusterTrustBundle", logError, err.Error())
		return errRetryAtResync
	}
	p.observe(ResultError)
	return fmt.Errorf("trust: %s ClusterTrustBundle %s: %w", op, b.Name, err)
}

func (p *ClusterTrustBundlePublisher) observe(result string) {
	if p.cfg.Observer != nil {
		p.cfg.Observer.ObserveWrite(result)
	}
}
