package splice

import (
	"net/http"
	"strconv"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// SetUpstreamHeaders sets on h, a request's to a replica, what the stream needs of
// the runner: its count of each choice's tokens and their ids on comment lines (so
// that the stream can be continued as the tokens it was generated as); and, when the
// stream broke and this request continues it, the continuation: the answer so far
// left open, the tokens and ids the client already has and, for a translated stream,
// where the client's stream stands.
func (st *Stream) SetUpstreamHeaders(h http.Header) {
	h.Set(runnerapi.HeaderTokenCounts, runnerapi.TokenCountComments)
	h.Set(runnerapi.HeaderTokenIDs, runnerapi.TokenCountComments)
	if !st.Broken() {
		return
	}
	h.Set(runnerapi.HeaderContinue, runnerapi.ContinueFinalMessage)
	if st.TokensKnown() {
		h.Set(runnerapi.HeaderContinuedTokens, strconv.FormatInt(st.SentTokens(), 10))
	}
	if ids := st.SentTokenIDs(); ids != "" {
		h.Set(runnerapi.HeaderContinuedTokenIDs, ids)
	}
	if rs := st.ResumeHeader(); rs != "" {
		h.Set(runnerapi.HeaderResumeStream, rs)
	}
}
