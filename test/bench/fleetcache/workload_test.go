package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

func TestScheduleIsASeededBoundedPoissonStream(t *testing.T) {
	const tenants, users, rate = 20, 25, 4.0
	a := schedule(7, tenants, users, rate, time.Hour)
	b := schedule(7, tenants, users, rate, time.Hour)
	if len(a) != tenants*users {
		t.Fatalf("%d requests, want %d", len(a), tenants*users)
	}
	seen := map[[2]int]bool{}
	for i, r := range a {
		if r != b[i] {
			t.Fatalf("request %d differs between two schedules of one seed: %+v vs %+v", i, r, b[i])
		}
		if i > 0 && r.At < a[i-1].At {
			t.Fatalf("arrival %d at %s before arrival %d at %s", i, r.At, i-1, a[i-1].At)
		}
		seen[[2]int{r.Tenant, r.User}] = true
	}
	if len(seen) != tenants*users {
		t.Errorf("%d distinct (tenant, user) pairs, want each of the %d once", len(seen), tenants*users)
	}
	// The mean gap of 499 exponential gaps of rate 4 is 0.25 s within a few percent.
	mean := a[len(a)-1].At.Seconds() / float64(len(a)-1)
	if math.Abs(mean-1/rate) > 0.25/rate {
		t.Errorf("mean gap %.3f s, want about %.3f s", mean, 1/rate)
	}
	if c := schedule(8, tenants, users, rate, time.Hour); c[1] == a[1] && c[2] == a[2] {
		t.Errorf("another seed gives the same arrivals")
	}
	capped := schedule(7, tenants, users, rate, 10*time.Second)
	if last := capped[len(capped)-1].At; last != 10*time.Second {
		t.Errorf("the last arrival under a 10 s limit is at %s", last)
	}
}

func TestSystemPromptsDifferByTenantAndSeed(t *testing.T) {
	a, b := systemPrompt(1, 0, 500), systemPrompt(1, 1, 500)
	if a == b || a != systemPrompt(1, 0, 500) || a == systemPrompt(2, 0, 500) {
		t.Fatal("system prompts are not a function of (seed, tenant) alone")
	}
	// Two tenants share at most the first few words ("You are the assistant of team").
	shared := 0
	for shared < len(a) && shared < len(b) && a[shared] == b[shared] {
		shared++
	}
	if shared > 40 {
		t.Errorf("two tenants' prompts share their first %d bytes", shared)
	}
	if n := len(strings.Fields(a)); n < 500 || n > 510 {
		t.Errorf("%d words, want 500 and the opening", n)
	}
	if userMessage(1, 2) == userMessage(2, 1) {
		t.Error("two users' messages are the same")
	}
}

func TestChatBodyCarriesTheTenantsPartitionAndKey(t *testing.T) {
	for _, tc := range []struct{ policy, want string }{
		{keyUser, "tenant-3-user-4"}, {keyTenant, "tenant-3"}, {keyNone, ""},
	} {
		var got struct {
			Key      string `json:"prompt_cache_key"`
			Salt     string `json:"cache_salt"`
			Stream   bool   `json:"stream"`
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal(chatBody("ns/m", "sys", cacheKey(tc.policy, 3, 4), 3, 4, 8), &got); err != nil {
			t.Fatal(err)
		}
		if got.Key != tc.want || got.Salt != "tenant-3" || !got.Stream || len(got.Messages) != 2 || got.Messages[0].Content != "sys" {
			t.Errorf("%s: %+v", tc.policy, got)
		}
	}
}
