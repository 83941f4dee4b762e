// Command fake-kubelet serves the kubelet's streaming endpoints — exec, attach and
// port-forward — with the kubelet's own streaming library (k8s.io/kubelet/pkg/cri/streaming),
// so a real kube-apiserver can proxy `kubectl exec` and `kubectl port-forward` to a Node
// whose status points here. Only the container runtime is simulated:
//
//   - exec runs one of three built-in commands in the "container": `echo ARGS...` (prints the
//     arguments), `cat` (copies stdin to stdout) and `hostname` (prints the pod's name);
//     anything else fails with exit code 127;
//   - attach copies stdin to stdout, as a container running `cat` would;
//   - port-forward to port P connects to 127.0.0.1:P on this machine (the test runs the
//     "pod's" server there).
//
// Usage:
//
//	fake-kubelet -listen 127.0.0.1:0 -ready FILE
//
// It serves HTTPS with a certificate it makes at start (the API server does not verify a
// kubelet's serving certificate unless --kubelet-certificate-authority is set), writes its
// port to the ready file once listening, and runs until killed. Every request is logged to
// stderr.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/kubelet/pkg/cri/streaming/portforward"
	remotecommandserver "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

const (
	idleTimeout           = 5 * time.Minute
	streamCreationTimeout = 30 * time.Second
)

type runtime struct{}

// ExecInContainer runs one of the built-in commands.
func (runtime) ExecInContainer(_ context.Context, pod string, _ types.UID, container string, cmd []string,
	in io.Reader, out, errOut io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return fmt.Errorf("no command")
	}
	switch cmd[0] {
	case "echo":
		_, err := fmt.Fprintln(out, strings.Join(cmd[1:], " "))
		return err
	case "cat":
		if in == nil {
			return nil
		}
		_, err := io.Copy(out, in)
		return err
	case "hostname":
		_, err := fmt.Fprintln(out, pod)
		return err
	}
	fmt.Fprintf(errOut, "fake-kubelet: %s: command not found in %s/%s\n", cmd[0], pod, container)
	return utilexec.CodeExitError{Err: fmt.Errorf("command not found"), Code: 127}
}

// AttachContainer behaves as a container running `cat`.
func (runtime) AttachContainer(_ context.Context, _ string, _ types.UID, _ string,
	in io.Reader, out, _ io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize) error {
	if in == nil {
		return nil
	}
	_, err := io.Copy(out, in)
	return err
}

// PortForward connects the stream to the port on this machine's loopback.
func (runtime) PortForward(ctx context.Context, pod string, _ types.UID, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("pod %s port %d: %w", pod, port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	return nil
}

// route splits /VERB/namespace/pod[/container] (the kubelet's streaming paths).
func route(path string) (verb, pod, container string, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) < 3 {
		return "", "", "", false
	}
	verb, pod = parts[0], parts[2]
	if len(parts) > 3 {
		container = parts[3]
	}
	return verb, pod, container, true
}

func serve(w http.ResponseWriter, r *http.Request) {
	log.Printf("%s %s (Upgrade: %s)", r.Method, r.URL.RequestURI(), r.Header.Get("Upgrade"))
	verb, pod, container, ok := route(r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	rt := runtime{}
	switch verb {
	case "exec", "attach":
		opts, err := remotecommandserver.NewOptions(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if verb == "exec" {
			remotecommandserver.ServeExec(w, r, rt, pod, "", container, r.URL.Query()["command"], opts,
				idleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
		} else {
			remotecommandserver.ServeAttach(w, r, rt, pod, "", container, opts,
				idleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
		}
	case "portForward":
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		portforward.ServePortForward(w, r, rt, pod, "", opts, idleTimeout, streamCreationTimeout,
			portforward.SupportedProtocols)
	default:
		http.NotFound(w, r)
	}
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fake-kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "HTTPS listen address")
	ready := flag.String("ready", "", "file to write the listening port to")
	flag.Parse()
	cert, err := selfSigned()
	if err != nil {
		log.Fatalf("certificate: %v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if *ready != "" {
		if err := os.WriteFile(*ready+".tmp", []byte(fmt.Sprint(port)), 0o644); err != nil {
			log.Fatalf("ready file: %v", err)
		}
		if err := os.Rename(*ready+".tmp", *ready); err != nil {
			log.Fatalf("ready file: %v", err)
		}
	}
	log.Printf("serving on 127.0.0.1:%d", port)
	server := &http.Server{
		Handler: http.HandlerFunc(serve),
		// The streaming library upgrades HTTP/1.1 connections (SPDY, WebSocket).
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}},
	}
	log.Fatal(server.Serve(tls.NewListener(ln, server.TLSConfig)))
}
