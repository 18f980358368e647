package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Do sends a request with a JSON body (a string or []byte is sent as is, anything
// else is marshalled, nil sends none) and header pairs, and returns the response
// with its body read. It fails the test on a transport error; the request gives up
// after two minutes.
func Do(tb testing.TB, method, url string, body any, header ...string) (*http.Response, []byte) {
	tb.Helper()
	return DoWith(tb, http.DefaultClient, method, url, body, header...)
}

// DoWith is Do through the client c.
func DoWith(tb testing.TB, c *http.Client, method, url string, body any, header ...string) (*http.Response, []byte) {
	tb.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp, b
}
