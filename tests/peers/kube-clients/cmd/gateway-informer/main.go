// Command gateway-informer runs a client-go Reflector — the list-then-watch loop under every
// informer — on the ConfigMaps of one namespace through a Kubernetes API URL (the meridian
// gateway's /clusters/*), and keeps what it holds in a state file for the test to read.
//
// Objects are keyed by their meridian.io/cluster annotation, namespace and name, so
// same-named objects of different members stay apart (an informer's default key would fold
// them). Every List and Watch call is counted, with the resourceVersion each Watch resumed
// from: a test can tell a resumed watch from a relist.
//
// Usage:
//
//	gateway-informer -server URL -ca FILE -token-file FILE -namespace NS -state FILE
//
// The state file (rewritten atomically every 100 ms while something changed):
//
//	{"lists": 1, "watches": ["mrv1....", ...], "objects": {"m1/shop/a": "<data.v>", ...}}
//
// It runs until killed.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

type state struct {
	sync.Mutex
	Lists   int               `json:"lists"`
	Watches []string          `json:"watches"`
	Objects map[string]string `json:"objects"`
	dirty   bool
}

func key(obj interface{}) (string, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return "", fmt.Errorf("not a ConfigMap: %T", obj)
	}
	return cm.Annotations["meridian.io/cluster"] + "/" + cm.Namespace + "/" + cm.Name, nil
}

// store is a cache.Store keyed by key(), mirroring its content into the state.
type store struct {
	cache.Store
	st *state
}

func (s *store) sync() {
	objects := map[string]string{}
	for _, o := range s.Store.List() {
		k, _ := key(o)
		objects[k] = o.(*corev1.ConfigMap).Data["v"]
	}
	s.st.Lock()
	s.st.Objects = objects
	s.st.dirty = true
	s.st.Unlock()
}

func (s *store) Add(o interface{}) error    { err := s.Store.Add(o); s.sync(); return err }
func (s *store) Update(o interface{}) error { err := s.Store.Update(o); s.sync(); return err }
func (s *store) Delete(o interface{}) error { err := s.Store.Delete(o); s.sync(); return err }
func (s *store) Replace(list []interface{}, rv string) error {
	err := s.Store.Replace(list, rv)
	s.sync()
	return err
}

func main() {
	server := flag.String("server", "", "the API URL (the gateway's .../clusters/*)")
	ca := flag.String("ca", "", "the CA certificate of the server")
	tokenFile := flag.String("token-file", "", "a file holding the bearer token")
	namespace := flag.String("namespace", "shop", "the namespace to list and watch")
	statePath := flag.String("state", "", "where to write the state")
	flag.Parse()
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg := &rest.Config{Host: *server, BearerToken: string(token), TLSClientConfig: rest.TLSClientConfig{CAFile: *ca}}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	st := &state{Objects: map[string]string{}}
	api := client.CoreV1().ConfigMaps(*namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			st.Lock()
			st.Lists++
			st.dirty = true
			st.Unlock()
			return api.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			st.Lock()
			st.Watches = append(st.Watches, o.ResourceVersion)
			st.dirty = true
			st.Unlock()
			return api.Watch(ctx, o)
		},
	}
	s := &store{Store: cache.NewStore(key), st: st}
	reflector := cache.NewReflector(lw, &corev1.ConfigMap{}, s, 0)
	go reflector.Run(make(chan struct{}))
	for {
		time.Sleep(100 * time.Millisecond)
		st.Lock()
		if !st.dirty {
			st.Unlock()
			continue
		}
		st.dirty = false
		out, _ := json.Marshal(st)
		st.Unlock()
		tmp := *statePath + ".tmp"
		if err := os.WriteFile(tmp, out, 0o644); err == nil {
			_ = os.Rename(tmp, *statePath)
		}
	}
}
