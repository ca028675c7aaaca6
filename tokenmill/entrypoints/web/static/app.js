// tokenmill's chat page. Everything lives in this browser's localStorage:
//   tokenmill.conversations  [{id, title, updated, messages: [Message]}], most recent first
//   tokenmill.current        the id of the open conversation
//   tokenmill.settings       {model, system, temperature, top_p, max_tokens} (strings; "" = not sent)
//   tokenmill.apiKey         the key, once the server asked for one (a 401 from /v1)
// Message: {role: "user" | "assistant", content, isExcluded?, error?, isStopped?, stats?}. A user message
// whose answer failed is excluded from later requests (it would fail again); the failed answer keeps the
// server's error text.
//
// Answers stream from /v1/chat/completions (SSE read from fetch); Stop aborts the fetch, and the server
// aborts a request whose client has gone. Model text reaches the page only through TokenmillMarkdown
// (markdown.js: it escapes everything first) or textContent.
(function () {
  "use strict";

  const KEYS = { conversations: "tokenmill.conversations", current: "tokenmill.current",
                 settings: "tokenmill.settings", apiKey: "tokenmill.apiKey" };
  const DEFAULT_SETTINGS = { model: "", system: "", temperature: "0.7", top_p: "0.95", max_tokens: "" };
  const NEW_TITLE = "New chat";
  const $ = (id) => document.getElementById(id);

  let conversations = readJson(KEYS.conversations, []);
  let currentId = localStorage.getItem(KEYS.current);
  const settings = Object.assign({}, DEFAULT_SETTINGS, readJson(KEYS.settings, {}));
  let inFlight = null;  // {controller, conversation, reply} while an answer streams
  const elements = new WeakMap();  // Message -> its .message element, while shown

  // -- storage -----------------------------------------------------------------------------------------
  function readJson(key, fallback) {
    try {
      const value = JSON.parse(localStorage.getItem(key));
      return value === null ? fallback : value;
    } catch (e) {
      return fallback;
    }
  }

  function save() {
    try {
      localStorage.setItem(KEYS.conversations, JSON.stringify(conversations));
      if (currentId) localStorage.setItem(KEYS.current, currentId);
      else localStorage.removeItem(KEYS.current);
      localStorage.setItem(KEYS.settings, JSON.stringify(settings));
    } catch (e) {  // e.g. the storage quota: say so rather than lose conversations silently
      notice(`could not save the conversations in this browser: ${e.message}`);
    }
  }

  function current() {
    return conversations.find((c) => c.id === currentId) || null;
  }

  function newConversation() {
    const conversation = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
                           title: NEW_TITLE, updated: Date.now(), messages: [] };
    conversations.unshift(conversation);
    currentId = conversation.id;
    return conversation;
  }

  function touch(conversation) {  // most recently used first
    conversation.updated = Date.now();
    conversations = [conversation, ...conversations.filter((c) => c !== conversation)];
  }

  // -- the server --------------------------------------------------------------------------------------
  async function api(path, init = {}) {
    // fetch with the stored key; on a 401 ask for the key (once per 401) and try again with it
    const attempt = () => {
      const headers = Object.assign({}, init.headers);
      const key = localStorage.getItem(KEYS.apiKey);
      if (key) headers.Authorization = `Bearer ${key}`;
      return fetch(path, Object.assign({}, init, { headers }));
    };
    const response = await attempt();
    if (response.status !== 401) return response;
    const text = await response.text();
    if (await askForKey(errorText(response, text))) return attempt();
    return new Response(text, { status: 401, headers: response.headers });  // declined: the 401 stands
  }

  function errorText(response, text) {
    // the server's own message: OpenAI's {"error": {"message"}} or Ollama's {"error": "..."}
    try {
      const body = JSON.parse(text);
      const message = body.error && (body.error.message || body.error) || body.detail;
      if (message) return `${response.status}: ${typeof message === "string" ? message : JSON.stringify(message)}`;
    } catch (e) { /* not JSON: the text itself */ }
    return `${response.status}: ${text || response.statusText}`;
  }

  let keyPrompt = null;  // the open dialog's answer: requests that meet a 401 meanwhile share it
  function askForKey(reason) {
    if (keyPrompt) return keyPrompt;
    const dialog = $("key-dialog");
    $("key-reason").textContent = `This server needs an API key (${reason}).`;
    $("key-input").value = "";
    keyPrompt = new Promise((resolve) => {
      dialog.addEventListener("close", () => {
        const key = $("key-input").value.trim();
        if (dialog.returnValue === "save" && key) {
          localStorage.setItem(KEYS.apiKey, key);
          resolve(true);
        } else {
          resolve(false);
        }
      }, { once: true });
      dialog.showModal();
    }).finally(() => { keyPrompt = null; });
    return keyPrompt;
  }

  async function loadModels() {
    const select = $("model");
    try {
      const response = await api("/v1/models");
      if (!response.ok) throw new Error(errorText(response, await response.text()));
      const ids = (await response.json()).data.map((m) => m.id);
      select.replaceChildren(...ids.map((id) => new Option(id, id)));
      if (!ids.includes(settings.model)) settings.model = ids[0] || "";
      select.value = settings.model;
      notice("");
    } catch (e) {
      notice(`could not list the models: ${e.message}`);
    }
  }

  // Server-Sent Events from a fetch body: yields each event's data (the lines after "data:", joined)
  async function* sseData(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      const events = buffer.split(/\r?\n\r?\n/);
      buffer = done ? "" : events.pop();
      for (const event of events) {
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(l.startsWith("data: ") ? 6 : 5)).join("\n");
        if (data) yield data;
      }
      if (done) return;
    }
  }

  function requestBody(conversation, reply) {
    const messages = [];
    if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
    for (const m of conversation.messages) {
      if (m === reply || m.isExcluded || (m.error && !m.content)) continue;
      messages.push({ role: m.role, content: m.content });
    }
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    if (settings.model) body.model = settings.model;
    for (const [field, parse] of [["temperature", parseFloat], ["top_p", parseFloat], ["max_tokens", parseInt]]) {
      const value = String(settings[field]).trim();
      if (value !== "") body[field] = parse(value, 10);
    }
    return body;
  }

  async function streamReply(conversation, reply, userMessage) {
    const controller = new AbortController();
    inFlight = { controller, conversation, reply };
    reply.isStreaming = true;  // saved as such if the page goes away mid-answer
    setBusy(true);
    const started = performance.now();
    let firstTokenAt = null;
    let usage = null;
    try {
      const response = await api("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify(requestBody(conversation, reply)), signal: controller.signal });
      if (!response.ok) throw new Error(errorText(response, await response.text()));
      for await (const data of sseData(response.body)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
        for (const choice of chunk.choices || []) {
          const text = choice.delta && choice.delta.content;
          // a thinking model's reasoning (--reasoning-parser), shown apart from the answer
          const thought = choice.delta && (choice.delta.reasoning || choice.delta.reasoning_content);
          if ((text || thought) && firstTokenAt === null) firstTokenAt = performance.now();
          if (text) reply.content += text;
          if (thought) reply.reasoning = (reply.reasoning || "") + thought;
        }
        if (chunk.usage) usage = chunk.usage;
        scheduleUpdate(reply);
      }
    } catch (e) {
      if (e.name === "AbortError") {
        reply.isStopped = true;
      } else {
        reply.error = e.message;
        if (!reply.content) userMessage.isExcluded = true;
      }
    } finally {
      reply.stats = stats(started, firstTokenAt, performance.now(), usage);
      delete reply.isStreaming;
      inFlight = null;
      setBusy(false);
      save();
      update(userMessage);
      update(reply);
      renderConversations();
    }
  }

  // time to first token: request sent -> first text; tokens/s: the tokens after the first over the time
  // after it (the decode rate), from the stream's usage (absent when the answer was stopped)
  function stats(started, firstTokenAt, ended, usage) {
    const out = {};
    if (firstTokenAt !== null) out.ttft_s = (firstTokenAt - started) / 1000;
    if (usage) {
      out.completion_tokens = usage.completion_tokens;
      out.prompt_tokens = usage.prompt_tokens;
      const decodeS = (ended - (firstTokenAt === null ? started : firstTokenAt)) / 1000;
      if (usage.completion_tokens > 1 && decodeS > 0) out.tokens_per_s = (usage.completion_tokens - 1) / decodeS;
    }
    return out;
  }

  function statsText(message) {
    const s = message.stats || {};
    const parts = [];
    if (s.completion_tokens !== undefined) parts.push(`${s.completion_tokens} tokens`);
    if (s.tokens_per_s !== undefined) parts.push(`${s.tokens_per_s.toFixed(1)} tok/s`);
    if (s.ttft_s !== undefined) parts.push(`time to first token ${s.ttft_s.toFixed(2)} s`);
    if (message.isStopped) parts.push("stopped");
    return parts.join(" · ");
  }

  // -- actions -----------------------------------------------------------------------------------------
  async function send() {
    const input = $("input");
    const text = input.value;
    if (!text.trim() || inFlight) return;
    const conversation = current() || newConversation();
    const userMessage = { role: "user", content: text };
    const reply = { role: "assistant", content: "" };
    conversation.messages.push(userMessage, reply);
    if (conversation.title === NEW_TITLE) conversation.title = text.trim().split("\n")[0].slice(0, 60);
    touch(conversation);
    input.value = "";
    save();
    render();
    await streamReply(conversation, reply, userMessage);
  }

  function stop() {
    if (inFlight) inFlight.controller.abort();
  }

  function switchTo(id) {  // an answer still streaming goes on, into its own conversation
    currentId = id;
    save();
    render();
  }

  function remove(id) {
    if (inFlight && inFlight.conversation.id === id) stop();
    conversations = conversations.filter((c) => c.id !== id);
    if (currentId === id) currentId = conversations.length ? conversations[0].id : null;
    save();
    render();
  }

  // -- rendering ---------------------------------------------------------------------------------------
  function notice(text) {
    $("notice").textContent = text;
  }

  function setBusy(isBusy) {
    $("send").hidden = isBusy;
    $("stop").hidden = !isBusy;
  }

  function render() {
    renderConversations();
    renderMessages();
  }

  function renderConversations() {
    const list = $("conversations");
    list.replaceChildren(...conversations.map((c) => {
      const item = document.createElement("li");
      item.dataset.id = c.id;
      item.classList.toggle("current", c.id === currentId);
      const title = document.createElement("button");
      title.type = "button";
      title.className = "title";
      title.textContent = c.title;
      title.title = c.title;
      title.addEventListener("click", () => switchTo(c.id));
      const del = document.createElement("button");
      del.type = "button";
      del.className = "delete";
      del.textContent = "\u00d7";
      del.title = "Delete this conversation";
      del.setAttribute("aria-label", `Delete ${c.title}`);
      del.addEventListener("click", () => remove(c.id));
      item.append(title, del);
      return item;
    }));
  }

  function renderMessages() {
    const box = $("messages");
    const conversation = current();
    if (!conversation || !conversation.messages.length) {
      const empty = document.createElement("p");
      empty.className = "empty";
      empty.textContent = "Send a message to start.";
      box.replaceChildren(empty);
      return;
    }
    box.replaceChildren(...conversation.messages.map((m) => {
      const element = document.createElement("div");
      element.className = `message ${m.role}`;
      const role = document.createElement("div");
      role.className = "role";
      role.textContent = m.role === "user" ? "You" : "Assistant";
      const body = document.createElement("div");
      body.className = "body";
      element.append(role, body);
      elements.set(m, element);
      return element;
    }));
    conversation.messages.forEach(update);
    box.scrollTop = box.scrollHeight;
  }

  function update(message) {
    // one message's element, from the message (the stream calls this as text arrives)
    const element = elements.get(message);
    if (!element || !element.isConnected) return;
    const box = $("messages");
    const isAtBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const body = element.querySelector(".body");
    element.classList.toggle("excluded", Boolean(message.isExcluded));
    element.classList.toggle("streaming", Boolean(inFlight && inFlight.reply === message));
    if (message.role === "user") {
      body.textContent = message.content;
    } else {
      body.innerHTML = window.TokenmillMarkdown.renderMarkdown(message.content);  // escaped by the renderer
      for (const pre of body.querySelectorAll("pre")) pre.append(copyButton(pre));
      if (message.reasoning) {  // collapsed once the answer starts; the element keeps what the user chose
        let details = element.querySelector("details.reasoning");
        if (!details) {
          details = document.createElement("details");
          details.className = "reasoning";
          details.open = !message.content;
          const summary = document.createElement("summary");
          summary.textContent = "Thinking";
          details.append(summary, textDiv("thought", ""));
          body.before(details);
        }
        details.querySelector(".thought").textContent = message.reasoning;
      }
    }
    for (const extra of element.querySelectorAll(".stats, .error")) extra.remove();
    const line = message.role === "assistant" ? statsText(message) : "";
    if (line) element.append(textDiv("stats", line));
    if (message.error) element.append(textDiv("error", message.error));
    if (isAtBottom) box.scrollTop = box.scrollHeight;
  }

  let pending = null;
  function scheduleUpdate(message) {  // at most one re-render per frame while tokens stream
    if (pending) return;
    pending = requestAnimationFrame(() => {
      pending = null;
      update(message);
    });
  }

  function textDiv(className, text) {
    const div = document.createElement("div");
    div.className = className;
    div.textContent = text;
    return div;
  }

  function copyButton(pre) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.addEventListener("click", async () => {
      const text = pre.querySelector("code").textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch (e) {  // no clipboard outside a secure context (http on another host): select the code instead
        const range = document.createRange();
        range.selectNodeContents(pre.querySelector("code"));
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        button.textContent = "Selected";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    });
    return button;
  }

  // -- wiring ------------------------------------------------------------------------------------------
  function bindSetting(id, field) {
    const input = $(id);
    input.value = settings[field];
    input.addEventListener("input", () => {
      settings[field] = input.value;
      save();
    });
  }

  function start() {
    bindSetting("system-prompt", "system");
    bindSetting("temperature", "temperature");
    bindSetting("top-p", "top_p");
    bindSetting("max-tokens", "max_tokens");
    $("model").addEventListener("change", (e) => {
      settings.model = e.target.value;
      save();
    });
    $("settings-toggle").addEventListener("click", (e) => {
      const panel = $("settings");
      panel.hidden = !panel.hidden;
      e.target.setAttribute("aria-expanded", String(!panel.hidden));
    });
    $("forget-key").addEventListener("click", () => {
      localStorage.removeItem(KEYS.apiKey);
      notice("API key forgotten");
    });
    $("new-chat").addEventListener("click", () => {
      const open = current();
      if (!open || open.messages.length) newConversation();  // an empty chat is reused, not piled up
      save();
      render();
      $("input").focus();
    });
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      send();
    });
    $("stop").addEventListener("click", stop);
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {  // Shift+Enter: the textarea's new line
        e.preventDefault();
        send();
      } else if (e.key === "Escape" && inFlight) {
        stop();
      }
    });
    window.addEventListener("storage", (e) => {  // another tab changed the conversations
      if (e.key === KEYS.conversations && !inFlight) {
        conversations = readJson(KEYS.conversations, []);
        render();
      }
    });
    window.addEventListener("pagehide", save);  // keeps the part of an answer that had arrived
    for (const c of conversations) {  // answers cut off by a reload or a closed tab
      for (const m of c.messages) {
        if (m.isStreaming) {
          delete m.isStreaming;
          m.isStopped = true;
        }
      }
    }
    render();
    loadModels();
    $("input").focus();
  }

  start();
})();
