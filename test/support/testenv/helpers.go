package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NewNamespace creates a namespace for one test, named after it with a random suffix,
// and deletes it when the test ends. envtest runs no namespace controller, so the
// namespace stays Terminating with its contents; tests never share one, so that is
// harmless.
func NewNamespace(tb testing.TB, c client.Client) string {
	tb.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: namePrefix(tb.Name())}}
	if err := c.Create(tb.Context(), ns); err != nil {
		tb.Fatalf("creating a namespace: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Delete(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
			tb.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// namePrefix turns a test name into a GenerateName prefix: a lowercase DNS label of at
// most 40 characters ending in a dash.
func namePrefix(testName string) string {
	var b strings.Builder
	dash := true // no leading dash
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	p := b.String()
	p = strings.TrimSuffix(p[:min(len(p), 40)], "-")
	if p == "" {
		p = "test"
	}
	return p + "-"
}

// Eventually calls cond at once and then every interval until it reports done, and
// fails the test with cond's last message if that has not happened within timeout.
func Eventually(tb testing.TB, timeout, interval time.Duration, cond func() (done bool, msg string)) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if done, _ := cond(); done {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			if done, msg := cond(); !done {
				tb.Fatalf("Condition not met within %v: %s", timeout, msg)
			}
			return
		}
	}
}
