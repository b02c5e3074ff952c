package kube

import (
	"context"
	"slices"
	"time"
)

// IndexedPods finds a Pod in a watch-fed index, asking no one
// (*PodIndex).
type IndexedPods interface {
	Indexed(ns, name string) (*PodInfo, bool)
}

// Plausibility tells, before a token's review and without asking
// anyone, whether the token is worth reviewing at once: limit.Vouch for
// one cluster. Whether it is valid only the review decides; plausible
// means it reads as the credential of a Pod this cluster runs now, which
// a token made up without knowing that Pod (its namespace, name, UID and
// service account) does not.
type Plausibility struct {
	// Cluster is the cluster's id; it prefixes the subjects.
	Cluster string
	// Pods is the cluster's Pod index.
	Pods IndexedPods
	// Audiences the token must carry one of; DefaultAudience when empty.
	Audiences []string
	// Now is the clock expiry is read on; time.Now when nil.
	Now func() time.Time
}

// Plausible implements limit.Vouch. token, read without verifying it,
// must be a JWT whose claims name the Pod it is bound to, with its UID,
// namespace and service account, carry one of p's audiences and an
// expiry not yet past; and the index must hold that Pod live with the
// same UID and service account. subject is the cluster and the Pod's
// UID: every token of that Pod, and no other, has it.
func (p *Plausibility) Plausible(_ context.Context, token string) (subject string, ok bool) {
	if !jwtShaped(token) {
		return "", false
	}
	c, err := ReadClaims(token)
	if err != nil {
		return "", false
	}
	auds := p.Audiences
	if len(auds) == 0 {
		auds = []string{DefaultAudience}
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	switch {
	case c.Namespace == "", c.ServiceAccount == "", c.PodName == "", c.PodUID == "":
		return "", false // not bound to a Pod
	case !slices.ContainsFunc(c.Audiences, func(a string) bool { return slices.Contains(auds, a) }):
		return "", false
	case c.Exp.IsZero() || !now().Before(c.Exp):
		return "", false
	}
	pod, ok := p.Pods.Indexed(c.Namespace, c.PodName)
	if !ok || pod.UID != c.PodUID || pod.ServiceAccount != c.ServiceAccount || !pod.Live() {
		return "", false
	}
	return p.Cluster + "/" + pod.UID, true
}
