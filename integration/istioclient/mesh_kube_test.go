package istioclient

// Stand-ins for what a cluster runs and this test apiserver lacks: the
// kubelet's volume sync (Secrets and ConfigMaps projected into files), a
// Service (a TCP forwarder to the ready istiod), and the Deployment
// controller (a rollout when the pod template changes). They act on the
// real apiserver's objects, so meshca sees what it would see in a cluster.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// source is one object a volume projects: its data keys, each as a file.
type source struct {
	secret          bool // a Secret; else a ConfigMap
	namespace, name string
	files           map[string]string // data key → file name
}

func (s source) String() string {
	kind := "ConfigMap"
	if s.secret {
		kind = "Secret"
	}
	return kind + " " + s.namespace + "/" + s.name
}

// read returns the files s projects; an error when the object or a key is
// missing (kubelet keeps the Pod waiting then).
func (s source) read(ctx context.Context, c kubernetes.Interface) (map[string][]byte, error) {
	data := map[string][]byte{}
	if s.secret {
		sec, err := c.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for k, v := range sec.Data {
			data[k] = v
		}
	} else {
		cm, err := c.CoreV1().ConfigMaps(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for k, v := range cm.Data {
			data[k] = []byte(v)
		}
	}
	out := map[string][]byte{}
	for key, file := range s.files {
		v, ok := data[key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %s", s, key)
		}
		out[file] = v
	}
	return out, nil
}

// volume is a source mounted in a directory as kubelet lays it out: each
// file a symlink to ..data/<file>, ..data a symlink to the directory of
// the current version, replaced by a rename. A reader never sees files of
// two versions, and istiod's and the agent's file watchers see one change.
type volume struct {
	dir      string
	src      source
	current  map[string][]byte
	versions int
}

// write lays out files as the volume's next version.
func (v *volume) write(files map[string][]byte) error {
	v.versions++
	version := fmt.Sprintf("..%d_%d", v.versions, time.Now().UnixNano())
	if err := os.MkdirAll(filepath.Join(v.dir, version), 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.dir, version, name), data, 0o644); err != nil {
			return err
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(version, tmp); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(v.dir, old))
	}
	v.current = files
	return nil
}

// sync writes the object's data when it differs from the files, and
// reports whether it did.
func (v *volume) sync(ctx context.Context, c kubernetes.Interface) (bool, error) {
	files, err := v.src.read(ctx, c)
	if err != nil {
		return false, err
	}
	same := len(files) == len(v.current)
	for name, data := range files {
		same = same && bytes.Equal(v.current[name], data)
	}
	if same {
		return false, nil
	}
	return true, v.write(files)
}

// kubelet keeps mounted volumes in step with their objects, polling as
// its sync loop does (every 200 ms here; up to a minute in a cluster).
type kubelet struct {
	client kubernetes.Interface
	mu     sync.Mutex
	vols   map[*volume]bool
	// written hears of every version written after the first, with the
	// volume's files.
	written func(v *volume)
	errs    []string
}

func newKubelet(c kubernetes.Interface, written func(*volume)) *kubelet {
	return &kubelet{client: c, vols: map[*volume]bool{}, written: written}
}

// mount writes src into dir, waiting (as kubelet keeps a Pod in
// ContainerCreating) until the object exists, then keeps it in step.
func (k *kubelet) mount(ctx context.Context, dir string, src source) (*volume, error) {
	v := &volume{dir: dir, src: src}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if _, err = v.sync(ctx, k.client); err == nil {
			k.mu.Lock()
			k.vols[v] = true
			k.mu.Unlock()
			return v, nil
		}
	}
	return nil, fmt.Errorf("mounting %s in %s: %w", src, dir, err)
}

func (k *kubelet) unmount(vols ...*volume) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, v := range vols {
		delete(k.vols, v)
	}
}

func (k *kubelet) errors() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.errs...)
}

// run syncs every mounted volume until ctx ends.
func (k *kubelet) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		k.mu.Lock()
		for v := range k.vols {
			changed, err := v.sync(ctx, k.client)
			switch {
			case err != nil && ctx.Err() == nil:
				k.errs = append(k.errs, fmt.Sprintf("%s: %v", v.src, err))
			case changed && k.written != nil:
				k.written(v)
			}
		}
		k.mu.Unlock()
	}
}

// service is one port of istiod's Service (xDS, or the webhooks): a
// fixed address that forwards each new connection to the istiod Pod ready
// now. A connection lives as long as the Pod it reached, as through
// kube-proxy.
type service struct {
	l       net.Listener
	mu      sync.Mutex
	backend string
}

func startService(t *testing.T) *service {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &service{l: l}
	t.Cleanup(func() { l.Close() })
	go s.serve()
	return s
}

func (s *service) addr() string { return s.l.Addr().String() }

// route sends new connections to addr.
func (s *service) route(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backend = addr
}

func (s *service) serve() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		go s.forward(c)
	}
}

func (s *service) forward(c net.Conn) {
	defer c.Close()
	s.mu.Lock()
	backend := s.backend
	s.mu.Unlock()
	up, err := net.DialTimeout("tcp", backend, 2*time.Second)
	if err != nil {
		return // no Pod ready: the client sees a reset and retries
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side closed: close both, as a reset Pod would
}

// rollout is one start of an istiod Pod for a generation of the
// Deployment, replacing the running Pod (when there was one) in the window
// [stopping, ended], in which the old Pod's streams end.
type rollout struct {
	generation      int64
	began, stopping time.Time // the generation was seen; the old Pod was told to stop
	ended           time.Time // the old Pod is gone, the status updated
	replaced        bool      // a running Pod, not the first one
}

// deployer is the Deployment controller for istiod's Deployment: when its
// generation changes (meshca patched the pod template), it starts a new
// Pod, routes the Service to it once ready, stops the old one and reports
// the rollout in the status, as `kubectl rollout status` reads it.
type deployer struct {
	client    kubernetes.Interface
	namespace string
	name      string
	svc       *service // xDS
	hooks     *service // the webhooks
	// newPod starts Pod n (mounting its volumes first) and returns it with
	// what to do once it stopped.
	newPod func(ctx context.Context, n int) (*istiod, func(), error)

	mu       sync.Mutex
	pods     []*istiod
	current  *istiod
	unmount  func()
	rolled   int64
	rollouts []rollout
	errs     []string
}

// run rolls the Deployment whenever its generation is not the one rolled,
// until ctx ends; then it stops the Pod it runs.
func (d *deployer) run(ctx context.Context) {
	defer func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.current != nil {
			d.current.stop()
			d.unmount()
		}
	}()
	for {
		dep, err := d.client.AppsV1().Deployments(d.namespace).Get(ctx, d.name, metav1.GetOptions{})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			d.fail("reading the Deployment: %v", err)
		case dep.Generation != d.rolledGeneration():
			if err := d.roll(ctx, dep.Generation); err != nil && ctx.Err() == nil {
				d.fail("rollout of generation %d: %v", dep.Generation, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (d *deployer) fail(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.errs = append(d.errs, fmt.Sprintf(format, args...))
}

func (d *deployer) rolledGeneration() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rolled
}

// roll replaces the Pod (or starts the first) for generation gen.
func (d *deployer) roll(ctx context.Context, gen int64) error {
	d.mu.Lock()
	old, oldUnmount, n := d.current, d.unmount, len(d.pods)+1
	d.mu.Unlock()
	r := rollout{generation: gen, began: time.Now(), replaced: old != nil}
	running := int32(0)
	if old != nil {
		running = 1
	}
	// The new ReplicaSet's Pod exists, not ready; the old one serves.
	if err := d.setStatus(ctx, gen, running+1, 1, running); err != nil {
		return err
	}
	p, unmount, err := d.newPod(ctx, n)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.pods = append(d.pods, p)
	d.current, d.unmount = p, unmount
	d.mu.Unlock()
	d.svc.route(p.secureAddr)
	d.hooks.route(p.httpsAddr)
	r.stopping = time.Now()
	if old != nil {
		old.stop()
		oldUnmount()
	}
	if err := d.setStatus(ctx, gen, 1, 1, 1); err != nil {
		return err
	}
	r.ended = time.Now()
	d.mu.Lock()
	d.rolled = gen
	d.rollouts = append(d.rollouts, r)
	d.mu.Unlock()
	return nil
}

// setStatus writes the Deployment's status for generation gen: replicas
// Pods, updated of the current template, available of them ready.
func (d *deployer) setStatus(ctx context.Context, gen int64, replicas, updated, available int32) error {
	deployments := d.client.AppsV1().Deployments(d.namespace)
	for {
		dep, err := deployments.Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		dep.Status.ObservedGeneration = gen
		dep.Status.Replicas, dep.Status.UpdatedReplicas = replicas, updated
		dep.Status.ReadyReplicas, dep.Status.AvailableReplicas = available, available
		dep.Status.UnavailableReplicas = replicas - available
		_, err = deployments.UpdateStatus(ctx, dep, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// restarts counts the rollouts that replaced a running Pod.
func (d *deployer) restarts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, r := range d.rollouts {
		if r.replaced {
			n++
		}
	}
	return n
}

func (d *deployer) snapshot() (rollouts []rollout, pods []*istiod, errs []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]rollout(nil), d.rollouts...), append([]*istiod(nil), d.pods...), append([]string(nil), d.errs...)
}
