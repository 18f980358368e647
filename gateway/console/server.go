package console

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Prefix is where the console is served.
const Prefix = "/ui"

// CookieName is the session cookie: it holds an opaque session id naming the API key
// the user signed in with (session.go), never the key; HttpOnly (no script reads it),
// SameSite=Strict (no other site sends it), and Secure when the browser came over TLS.
// Every page checks the session's key against the gateway's current keys, so a
// revoked key is out at once.
const CookieName = "macfleet_console"

// ConsoleHeader must be present on the playground's chat requests: a cross-site form
// cannot set a header, so this and SameSite=Strict keep other sites from spending a
// signed-in user's key.
const ConsoleHeader = "X-Macfleet-Console"

// ContentSecurityPolicy allows only the console's own script and stylesheet and
// requests to its own origin; memory bars are SVG attributes, not inline styles.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

//go:embed assets
var assets embed.FS

// Options configure the console.
type Options struct {
	// Source reads the objects the pages show (Snapshot.Now is set by the console).
	Source func(context.Context) (Snapshot, error)
	// API is the gateway's handler, authentication included; the playground's chat is
	// passed to its POST /v1/chat/completions with the signed-in key as a Bearer token.
	API http.Handler
	// Identify is whose an API key is (the gateway's own lookup of admin and team
	// keys); nil means the gateway has no client auth, and every visitor sees what an
	// admin sees. Every page is built from Scope(snapshot, identity): an admin key sees
	// the whole fleet, a team's key what its namespace may use, and the fleet page
	// answers it 403.
	Identify func(key string) (tenancy.Identity, bool)
	// Usage reads the gateways' TokenUsage ledgers for the usage page; nil shows none.
	Usage func(context.Context) ([]mfv1.TokenUsage, error)
	// Now is the clock of ages on the pages; nil means time.Now.
	Now func() time.Time
	// PollInterval is how often the script refreshes a page (2s when 0).
	PollInterval time.Duration
	// TrustedProxies are the addresses of proxies (a TLS ingress) whose
	// X-Forwarded-Proto: https makes the session cookie Secure; a connection that is
	// itself TLS always does.
	TrustedProxies []netip.Prefix
	Log            logr.Logger
}

type console struct {
	opts     Options
	pages    map[string]*template.Template
	static   http.Handler
	sessions *sessions
	logins   *loginLimit
}

// pageData is what the layout renders.
type pageData struct {
	Title, Active string
	Auth          bool
	// Admin: the visitor sees the whole fleet (the fleet page is in the menu); Team is
	// the namespace of a team's key.
	Admin bool
	Team  string
	// Forbidden: the page says why the visitor may not see it (and is not refreshed).
	Forbidden  bool
	PollMillis int64
	Generated  string
	Next       string
	Error      string
	Page       any
}

// New is the console's handler for everything under Prefix.
func New(opts Options) (http.Handler, error) {
	if opts.Source == nil || opts.API == nil {
		return nil, fmt.Errorf("console: Source and API are required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 2 * time.Second
	}
	c := &console{opts: opts, pages: map[string]*template.Template{}, sessions: newSessions(), logins: newLoginLimit()}
	funcs := template.FuncMap{"join": strings.Join}
	for _, p := range []string{"fleet", "models", "unloads", "playground", "usage", "login", "forbidden"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+p+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing %s: %w", p, err)
		}
		c.pages[p] = t
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix(Prefix+"/static/", http.FileServerFS(static))

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
	})
	mux.Handle("GET "+Prefix+"/static/", c.static)
	mux.HandleFunc("GET "+Prefix+"/login", c.loginForm)
	mux.HandleFunc("POST "+Prefix+"/login", c.login)
	mux.HandleFunc("POST "+Prefix+"/logout", c.logout)
	mux.Handle("GET "+Prefix+"/{$}", c.page(pageSpec{name: "fleet", title: "Fleet", admin: true,
		build: func(_ *http.Request, s Snapshot) (any, string) { return BuildFleet(s), "" }}))
	mux.Handle("GET "+Prefix+"/models", c.page(pageSpec{name: "models", title: "Models",
		build: func(_ *http.Request, s Snapshot) (any, string) { return BuildModels(s), "" }}))
	mux.Handle("GET "+Prefix+"/unloads", c.page(pageSpec{name: "unloads", title: "Unloads",
		build: func(_ *http.Request, s Snapshot) (any, string) { return BuildUnloads(s), "" }}))
	mux.Handle("GET "+Prefix+"/playground", c.page(pageSpec{name: "playground", title: "Playground",
		build: func(_ *http.Request, s Snapshot) (any, string) { return BuildPlayground(s), "" }}))
	mux.Handle("GET "+Prefix+"/usage", c.page(pageSpec{name: "usage", title: "Usage", usage: true, build: usagePage}))
	mux.HandleFunc("POST "+Prefix+"/chat", c.chat)
	mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such page: "+r.Method+" "+r.URL.Path, http.StatusNotFound)
	})
	// Sign-in, sign-out and chat are POSTs: a browser's cross-origin POST is refused
	// before it reaches them (Sec-Fetch-Site / Origin checks).
	return securityHeaders(http.NewCrossOriginProtection().Handler(mux)), nil
}

func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if !strings.HasPrefix(r.URL.Path, Prefix+"/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// key is the API key a request carries: its session's (the cookie), else a Bearer
// token (for scripts and curl). A cookie of no current session carries none.
func (c *console) key(r *http.Request) string {
	if ck, err := r.Cookie(CookieName); err == nil && ck.Value != "" {
		k, _ := c.sessions.key(ck.Value, c.opts.Now())
		return k
	}
	k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return k
}

// identify is who the request's key belongs to; false when it has none the gateway
// accepts. Without client auth every visitor is an admin.
func (c *console) identify(r *http.Request) (tenancy.Identity, bool) {
	if c.opts.Identify == nil {
		return tenancy.Identity{Admin: true}, true
	}
	k := c.key(r)
	if k == "" {
		return tenancy.Identity{}, false
	}
	return c.opts.Identify(k)
}

// pageSpec is one page of the console.
type pageSpec struct {
	name, title string
	// admin: only an admin key may see it (a team's key gets 403).
	admin bool
	// usage: the page reads the TokenUsage ledgers.
	usage bool
	// build makes the page from the scoped snapshot, or says why the visitor may not
	// see what the request asks.
	build func(r *http.Request, s Snapshot) (page any, forbidden string)
}

// notAdmin is what a team's key is told on a page that needs an admin key.
const notAdmin = "This page shows every Mac of the fleet and every team's deployments, so it needs an admin key " +
	"(one of the gateway's keys file). Your key is a team's: the Models, Unloads, Playground and Usage pages show what your namespace may use."

func (c *console) page(p pageSpec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := c.identify(r)
		if !ok {
			http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
			return
		}
		d := pageData{Title: p.title, Active: p.name}
		now := c.opts.Now()
		if p.admin && !id.Admin {
			c.forbidden(w, d, id, notAdmin, now)
			return
		}
		s, err := c.opts.Source(r.Context())
		if err != nil {
			c.opts.Log.Error(err, "Reading the fleet for the console")
			http.Error(w, "the fleet could not be read; see the gateway's log", http.StatusServiceUnavailable)
			return
		}
		s.Usage = nil
		if p.usage && c.opts.Usage != nil {
			if s.Usage, err = c.opts.Usage(r.Context()); err != nil {
				c.opts.Log.Error(err, "Reading the TokenUsages for the console")
				http.Error(w, "the usage ledgers could not be read; see the gateway's log", http.StatusServiceUnavailable)
				return
			}
		}
		s.Now = now
		page, why := p.build(r, Scope(s, id))
		if why != "" {
			c.forbidden(w, d, id, why, now)
			return
		}
		d.Page = page
		c.render(w, http.StatusOK, p.name, d, id, now)
	})
}

// forbidden answers 403 with a page that says why.
func (c *console) forbidden(w http.ResponseWriter, d pageData, id tenancy.Identity, why string, now time.Time) {
	d.Page, d.Forbidden = why, true
	c.render(w, http.StatusForbidden, "forbidden", d, id, now)
}

// usagePage is a namespace's usage: a team's own (asking for another namespace's is
// forbidden), any namespace's or all for an admin (?namespace=), over ?days= days.
func usagePage(r *http.Request, s Snapshot) (any, string) {
	ns := r.URL.Query().Get("namespace")
	if !s.Viewer.Admin {
		if ns != "" && ns != s.Viewer.Namespace {
			return nil, "A team's key reads its own namespace's usage (" + s.Viewer.Namespace + "); another namespace's needs an admin key."
		}
		ns = s.Viewer.Namespace
	}
	days := DefaultUsageDays
	if v := r.URL.Query().Get("days"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxUsageDays {
			n = DefaultUsageDays
		}
		days = n
	}
	return BuildUsage(s, ns, days), ""
}

func (c *console) render(w http.ResponseWriter, status int, name string, d pageData, id tenancy.Identity, now time.Time) {
	d.Auth = c.opts.Identify != nil
	d.Admin, d.Team = id.Admin, id.Namespace
	d.PollMillis = c.opts.PollInterval.Milliseconds()
	d.Generated = now.UTC().Format(time.RFC3339)
	var b strings.Builder
	if err := c.pages[name].Execute(&b, d); err != nil {
		c.opts.Log.Error(err, "Rendering a console page", "page", name)
		http.Error(w, "the page could not be rendered; see the gateway's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// safeNext keeps a post-login redirect inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix+"/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix + "/"
	}
	return next
}

func (c *console) loginForm(w http.ResponseWriter, r *http.Request) {
	if c.opts.Identify == nil {
		http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
		return
	}
	c.render(w, http.StatusOK, "login", pageData{Title: "Sign in", Next: safeNext(r.URL.Query().Get("next"))}, tenancy.Identity{}, c.opts.Now())
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	k := strings.TrimSpace(r.PostFormValue("key"))
	next := safeNext(r.PostFormValue("next"))
	if c.opts.Identify == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if ok, retry := c.logins.allow(sourceOf(r), c.opts.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
		c.render(w, http.StatusTooManyRequests, "login", pageData{Title: "Sign in", Next: next,
			Error: "Too many sign-ins from your address: try again in " + retry.String() + "."}, tenancy.Identity{}, c.opts.Now())
		return
	}
	var id tenancy.Identity
	ok := false
	if k != "" {
		id, ok = c.opts.Identify(k)
	}
	if !ok {
		c.render(w, http.StatusUnauthorized, "login", pageData{Title: "Sign in", Next: next,
			Error: "That is not an API key of this gateway: sign in with an admin key of the gateway's keys file or a team's key."},
			tenancy.Identity{}, c.opts.Now())
		return
	}
	if next == Prefix+"/" && !id.Admin {
		next = Prefix + "/models" // the fleet page needs an admin key
	}
	if old, err := r.Cookie(CookieName); err == nil {
		c.sessions.end(old.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: c.sessions.start(k, c.opts.Now()), Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overTLS(r, c.opts.TrustedProxies), MaxAge: int(SessionTTL.Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the request's session at the gateway (its cookie is refused from then
// on, by whoever sends it) and clears the cookie.
func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(CookieName); err == nil {
		c.sessions.end(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overTLS(r, c.opts.TrustedProxies), MaxAge: -1})
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}

// chat passes the playground's request to the gateway's public chat API as is, with
// the session's key as the Bearer token, so it is routed, authenticated, metered and
// streamed exactly like any client's.
func (c *console) chat(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(ConsoleHeader) == "" {
		http.Error(w, "the playground's requests come from the console's own page", http.StatusForbidden)
		return
	}
	if _, ok := c.identify(r); !ok {
		http.Error(w, "sign in to the console first", http.StatusUnauthorized)
		return
	}
	fwd := r.Clone(r.Context())
	fwd.URL = &url.URL{Path: "/v1/chat/completions"}
	fwd.RequestURI = ""
	fwd.Header.Del("Cookie")
	fwd.Header.Del(ConsoleHeader)
	if k := c.key(r); k != "" {
		fwd.Header.Set("Authorization", "Bearer "+k)
	}
	c.opts.API.ServeHTTP(w, fwd)
}
