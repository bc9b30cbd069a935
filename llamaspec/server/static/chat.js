// The chat page of llamaspec serve: streams replies from the server's own /v1/chat/completions
// and colours each token by where it came from (the chunk's "sources", beside its "pieces").
// Model text is only ever put in the page as text (textContent), never parsed as HTML.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const STYLED = ["plain", "lookup", "draft", "lookahead", "heads", "grammar", "consensus", "cache"];
  let messages = [];      // the conversation, as the API takes it
  let chatCounts = {};    // tokens of every reply so far, by source
  let apiKey = "";
  let controller = null;  // the reply under way's, to stop it

  function headers() {
    const h = {"Content-Type": "application/json"};
    if (apiKey) h["Authorization"] = "Bearer " + apiKey;
    return h;
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  function paint(el, source) {  // a plugin's source: a colour of its own, from its name
    if (STYLED.includes(source)) return;
    let h = 0;
    for (const c of source) h = (h * 31 + c.charCodeAt(0)) % 360;
    el.style.background = `hsl(${h} 70% 85%)`;
  }

  function token(text, source, step) {
    const span = document.createElement("span");
    span.className = "tok";
    span.dataset.source = source;
    span.dataset.step = String(step);
    span.title = `${source}, step ${step}`;
    span.textContent = text;
    paint(span, source);
    return span;
  }

  function addMessage(role, text) {
    const div = document.createElement("div");
    div.className = "message " + role;
    const label = document.createElement("span");
    label.className = "role";
    label.textContent = role;
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    div.append(label, body);
    $("chat").append(div);
    return div;
  }

  function shares(counts) {
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    if (!total) return "-";
    return Object.entries(counts).sort((a, b) => b[1] - a[1])
      .map(([s, n]) => `${s} ${Math.round(100 * n / total)}% (${n})`).join(", ");
  }

  function showLegend() {
    const legend = $("legend");
    legend.replaceChildren();
    const seen = new Set(["plain", ...Object.keys(chatCounts)]);
    for (const source of seen) legend.append(token(source, source, "-"));
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  async function failure(response) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      message = (body.error && body.error.message) || message;
    } catch (e) { /* not JSON: the status says it */ }
    if (response.status === 401) {
      $("key-form").hidden = false;
      $("api-key").focus();
      message = "this server needs its API key: " + message;
    }
    showError(message);
  }

  async function send(text) {
    showError("");
    const conversation = messages;  // New chat replaces it: a reply stopped so does not leak into the next
    conversation.push({role: "user", content: text});
    const asked = addMessage("user", text);
    const answer = addMessage("assistant", "");
    const body = answer.querySelector(".text");
    const counts = {};
    let content = "", step = 0, tokens = 0, first = null, last = "plain", tps = null;
    const replyStats = () => {
      const rate = tps !== null ? tps : (first !== null && tokens > 1 ?
        (tokens - 1) / ((performance.now() - first) / 1000) : 0);
      $("reply-stats").textContent = `${tokens} tokens, ${rate.toFixed(1)} t/s decode; ${shares(counts)}`;
      $("chat-stats").textContent = shares(chatCounts);
    };
    const handle = (chunk) => {
      if (chunk.error) { showError(chunk.error.message); return; }
      if (chunk.timings) tps = chunk.timings.predicted_per_second;
      const choice = (chunk.choices || [])[0];
      if (!choice) return;
      const text = (choice.delta && choice.delta.content) || "";
      const sources = choice.sources || [];
      content += text;
      if (sources.length) {
        step += 1;
        if (first === null) first = performance.now();
        tokens += sources.length;
        for (const s of sources) {
          counts[s] = (counts[s] || 0) + 1;
          chatCounts[s] = (chatCounts[s] || 0) + 1;
        }
        last = sources[sources.length - 1];
      }
      const pieces = choice.pieces || [];
      if (sources.length && pieces.length === sources.length && pieces.join("") === text) {
        pieces.forEach((p, i) => { if (p) body.append(token(p, sources[i], step)); });
      } else if (text) {
        body.append(token(text, last, step));
      }
      showLegend();
      replyStats();
      $("chat").scrollTop = $("chat").scrollHeight;
    };
    controller = new AbortController();
    setBusy(true);
    const request = {messages: conversation, stream: true, temperature: Number($("temperature").value),
                     max_tokens: Number($("max-tokens").value) || null, spec: $("spec").value.trim() || "auto"};
    let sent = false;
    try {
      const response = await fetch("/v1/chat/completions", {method: "POST", headers: headers(),
                                                            body: JSON.stringify(request), signal: controller.signal});
      if (!response.ok) {  // nothing was said: the question goes back to the box
        await failure(response);
        conversation.pop();
        asked.remove();
        answer.remove();
        $("prompt").value = text;
        return;
      }
      sent = true;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (line.startsWith("data: ") && line !== "data: [DONE]") handle(JSON.parse(line.slice(6)));
          }
        }
      }
      answer.dataset.done = "true";
    } catch (e) {
      if (e.name === "AbortError") answer.dataset.done = "stopped";
      else showError(String(e));
    } finally {
      if (sent) conversation.push({role: "assistant", content});
      controller = null;
      setBusy(false);
    }
  }

  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value;
    if (!text.trim() || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("ask").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("new-chat").addEventListener("click", () => {
    if (controller) controller.abort();
    messages = [];
    chatCounts = {};
    $("chat").replaceChildren();
    $("reply-stats").textContent = "-";
    $("chat-stats").textContent = "-";
    showError("");
    showLegend();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $("api-key").value;
    $("key-form").hidden = true;
    showError("");
    loadModel();
  });

  async function loadModel() {
    const response = await fetch("/v1/models", {headers: headers()});
    if (!response.ok) { await failure(response); return; }
    const models = await response.json();
    $("model").textContent = models.data.map((m) => m.id).join(", ");
  }

  showLegend();
  loadModel();
})();
