package console

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Prefix is where the console is served.
const Prefix = "/ui"

// CookieName is the session cookie: it holds the API key the user signed in with,
// HttpOnly (no script reads it) and SameSite=Strict (no other site sends it), so every
// page checks the key against the gateway's current keys and a revoked key is out at
// once.
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
	// Authorize says whether an API key may use the console (the gateway's admin
	// keys: its pages show every namespace); nil means the gateway has no client auth
	// and neither has the console.
	Authorize func(key string) bool
	// Now is the clock of ages on the pages; nil means time.Now.
	Now func() time.Time
	// PollInterval is how often the script refreshes a page (2s when 0).
	PollInterval time.Duration
	Log          logr.Logger
}

type console struct {
	opts   Options
	pages  map[string]*template.Template
	static http.Handler
}

// pageData is what the layout renders.
type pageData struct {
	Title, Active string
	Auth          bool
	PollMillis    int64
	Generated     string
	Next          string
	Error         string
	Page          any
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
	c := &console{opts: opts, pages: map[string]*template.Template{}}
	funcs := template.FuncMap{"join": strings.Join}
	for _, p := range []string{"fleet", "models", "unloads", "playground", "login"} {
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
	mux.Handle("GET "+Prefix+"/{$}", c.page("fleet", "Fleet", func(s Snapshot) any { return BuildFleet(s) }))
	mux.Handle("GET "+Prefix+"/models", c.page("models", "Models", func(s Snapshot) any { return BuildModels(s) }))
	mux.Handle("GET "+Prefix+"/unloads", c.page("unloads", "Unloads", func(s Snapshot) any { return BuildUnloads(s) }))
	mux.Handle("GET "+Prefix+"/playground", c.page("playground", "Playground", func(s Snapshot) any { return BuildPlayground(s) }))
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

// key is the API key a request carries: the session cookie, else a Bearer token (for
// scripts and curl).
func key(r *http.Request) string {
	if c, err := r.Cookie(CookieName); err == nil && c.Value != "" {
		return c.Value
	}
	k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return k
}

func (c *console) authorized(r *http.Request) bool {
	if c.opts.Authorize == nil {
		return true
	}
	k := key(r)
	return k != "" && c.opts.Authorize(k)
}

func (c *console) page(name, title string, build func(Snapshot) any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.authorized(r) {
			http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
			return
		}
		s, err := c.opts.Source(r.Context())
		if err != nil {
			c.opts.Log.Error(err, "Reading the fleet for the console")
			http.Error(w, "the fleet could not be read; see the gateway's log", http.StatusServiceUnavailable)
			return
		}
		s.Now = c.opts.Now()
		c.render(w, http.StatusOK, name, pageData{Title: title, Active: name, Page: build(s)}, s.Now)
	})
}

func (c *console) render(w http.ResponseWriter, status int, name string, d pageData, now time.Time) {
	d.Auth = c.opts.Authorize != nil
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
	if c.opts.Authorize == nil {
		http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
		return
	}
	c.render(w, http.StatusOK, "login", pageData{Title: "Sign in", Next: safeNext(r.URL.Query().Get("next"))}, c.opts.Now())
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	k := strings.TrimSpace(r.PostFormValue("key"))
	next := safeNext(r.PostFormValue("next"))
	if c.opts.Authorize == nil {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if k == "" || !c.opts.Authorize(k) {
		c.render(w, http.StatusUnauthorized, "login", pageData{Title: "Sign in", Next: next,
			Error: "That is not an admin API key of this gateway: the console shows the whole fleet, so it takes a key of the gateway's keys file, not a team's key."}, c.opts.Now())
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: k, Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int((12 * time.Hour).Seconds())})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
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
	if !c.authorized(r) {
		http.Error(w, "sign in to the console first", http.StatusUnauthorized)
		return
	}
	fwd := r.Clone(r.Context())
	fwd.URL = &url.URL{Path: "/v1/chat/completions"}
	fwd.RequestURI = ""
	fwd.Header.Del("Cookie")
	fwd.Header.Del(ConsoleHeader)
	if k := key(r); k != "" {
		fwd.Header.Set("Authorization", "Bearer "+k)
	}
	c.opts.API.ServeHTTP(w, fwd)
}
