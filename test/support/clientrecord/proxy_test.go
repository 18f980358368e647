package clientrecord

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestProxyRecordsAndStreams: every request is recorded without its credentials and
// passed on; a stream reaches the client event by event, before the upstream ends it.
func TestProxyRecordsAndStreams(t *testing.T) {
	release := make(chan struct{})
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, fmt.Sprintf("%s %s auth=%q key=%q %s", r.Method, r.URL.RequestURI(),
			r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), b))
		if r.URL.Path == "/v1/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, "data: two\n\n")
			return
		}
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	defer up.Close()
	p, err := New(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	p.Adjust = func(path string, body []byte) []byte {
		if path == "/v1/stream" {
			return []byte(strings.Replace(string(body), "}", `,"added":1}`, 1))
		}
		return body
	}
	srv := httptest.NewServer(p)
	defer srv.Close()

	req, _ := http.NewRequest("POST", srv.URL+"/v1/plain?beta=true", strings.NewReader(`{"a":1}`))
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || string(b) != `{"ok":true}` {
		t.Fatalf("plain: %d %s", resp.StatusCode, b)
	}

	req, _ = http.NewRequest("POST", srv.URL+"/v1/stream", strings.NewReader(`{"b":2}`))
	req.Header.Set("X-Api-Key", "secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		first <- line
	}()
	select {
	case line := <-first:
		if line != "data: one\n" {
			t.Errorf("first line %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event did not arrive before the stream ended: the proxy buffers")
	}
	close(release)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	got := p.Exchanges()
	if len(got) != 2 {
		t.Fatalf("%d exchanges, want 2", len(got))
	}
	for i := range got {
		got[i].Header = map[string]string{"anthropic-version": got[i].Header["anthropic-version"],
			"authorization": got[i].Header["authorization"], "x-api-key": got[i].Header["x-api-key"]}
		got[i].ResponseHeader = nil
	}
	want := []Exchange{
		{Method: "POST", Path: "/v1/plain?beta=true", Header: map[string]string{"anthropic-version": "2023-06-01", "authorization": "", "x-api-key": ""},
			Body: []byte(`{"a":1}`), Status: http.StatusTeapot, Response: []byte(`{"ok":true}`), Done: true},
		{Method: "POST", Path: "/v1/stream", Header: map[string]string{"anthropic-version": "", "authorization": "", "x-api-key": ""},
			Body: []byte(`{"b":2}`), Status: 200, Response: []byte("data: one\n\ndata: two\n\n"), Done: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("exchanges (-want +got):\n%s", diff)
	}
	wantSeen := []string{`POST /v1/plain?beta=true auth="Bearer secret" key="" {"a":1}`, `POST /v1/stream auth="" key="secret" {"b":2,"added":1}`}
	if diff := cmp.Diff(wantSeen, seen); diff != "" {
		t.Errorf("the upstream saw (-want +got):\n%s", diff)
	}
	p.Reset()
	if n := len(p.Exchanges()); n != 0 {
		t.Errorf("%d exchanges after Reset", n)
	}
}

func TestProxyUnreachableUpstream(t *testing.T) {
	up := httptest.NewServer(http.NotFoundHandler())
	up.Close()
	p, err := New(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/x", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	x := p.Exchanges()
	if resp.StatusCode != http.StatusBadGateway || len(x) != 1 || x[0].Status != 0 || !x[0].Done {
		t.Errorf("status %d, exchanges %+v", resp.StatusCode, x)
	}
}
