package gateway

import (
	"net/http"

	"github.com/macfleet/macfleet/gateway/keepalive"
)

// holdStream is w with the keep-alives of a streaming request while the gateway holds
// it (package keepalive), and the function that ends them before the handler returns;
// any other request's w unchanged.
func (g *Gateway) holdStream(w http.ResponseWriter, r *http.Request, head requestHead) (http.ResponseWriter, func()) {
	api, ok := keepalive.APIOf(r.URL.Path)
	if !ok || !head.stream || g.opts.StreamKeepAlive < 0 {
		return w, func() {}
	}
	k := keepalive.New(w, api, g.opts.StreamKeepAlive)
	return k, k.Close
}
