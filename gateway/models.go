package gateway

import (
	"encoding/json"
	"net/http"

	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// modelObject is one entry of GET /v1/models: the OpenAI fields plus the deployment's
// namespace, aliases and routable replica count.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Extensions (ignored by OpenAI clients).
	Namespace     string   `json:"namespace"`
	Deployment    string   `json:"deployment"`
	Aliases       []string `json:"aliases,omitempty"`
	ReadyReplicas int      `json:"ready_replicas"`
}

// modelObjectOf is rt's entry, named as id should send it (Table.ClientName).
func modelObjectOf(t *Table, rt *Route, id tenancy.Identity) modelObject {
	return modelObject{ID: t.ClientName(rt, id), Object: "model", Created: rt.Created.Unix(), OwnedBy: rt.Namespace,
		Namespace: rt.Namespace, Deployment: rt.Deployment, Aliases: rt.Aliases, ReadyReplicas: len(rt.Backends)}
}

// handleListModels lists one model per ModelDeployment the caller may use, sorted by
// namespace and name.
func (g *Gateway) handleListModels(w http.ResponseWriter, r *http.Request) {
	t := g.Table()
	id := g.caller(r)
	data := make([]modelObject, 0, len(t.Routes()))
	for _, rt := range t.RoutesFor(id) {
		data = append(data, modelObjectOf(t, rt, id))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleGetModel answers GET /v1/models/{id} for any name a request may use.
func (g *Gateway) handleGetModel(w http.ResponseWriter, r *http.Request) {
	t := g.Table()
	id := g.caller(r)
	rt, aerr := resolve(t, r.PathValue("id"), id)
	if aerr != nil {
		aerr.write(w)
		return
	}
	writeJSON(w, http.StatusOK, modelObjectOf(t, rt, id))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		(&apiError{Status: http.StatusInternalServerError, Type: openaierr.TypeServer, Code: "internal_error",
			Message: "encoding the response: " + err.Error()}).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
