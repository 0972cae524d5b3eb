// The ipybox console's one script: live asks over the event stream (/events), answers without a reload,
// countdowns, and the overview's refresh. Pages work without it. Text from the server is only ever set
// as text (textContent); the only HTML inserted is the server's own rendered (escaped) fragments.
"use strict";

(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";
  const page = document.body.dataset.page;
  const pending = new Set();
  let overviewTimer = null;

  const $ = (selector, root = document) => root.querySelector(selector);

  function banner(text) {
    const element = $("#banner");
    if (!element) return;
    element.textContent = text;
    element.hidden = !text;
  }

  function setLive(state, text) {
    const element = $("#live");
    if (!element) return;
    element.dataset.state = state;
    element.textContent = text;
  }

  function showCount() {
    const badge = $("#pending-count");
    if (badge) {
      badge.textContent = String(pending.size);
      badge.dataset.count = String(pending.size);
    }
    const overview = $("#overview-pending");
    if (overview) overview.textContent = String(pending.size);
    document.title = document.title.replace(/^\(\d+\) /, "");
    if (pending.size) document.title = `(${pending.size}) ${document.title}`;
    const none = $("#no-asks");
    if (none) none.hidden = document.querySelectorAll("#asks .ask").length > 0;
  }

  function describe(answer) {
    const verb = answer.accept ? "allowed" : "denied";
    const reach = { once: "once", session: "for this session", always: "always" }[answer.scope] || answer.scope;
    return `${verb} ${reach} by ${answer.by || answer.route}`;
  }

  function note(id, callText, outcome, text) {
    const notes = $("#ask-notes");
    if (!notes) return;
    const element = document.createElement("p");
    element.className = `ask-note ask-note-${outcome}`;
    element.dataset.closedAskId = id;
    element.dataset.outcome = outcome;
    element.textContent = `${callText}: ${text}`;
    notes.prepend(element);
    while (notes.children.length > 20) notes.lastElementChild.remove();
  }

  // -- asks

  function cardOf(id) {
    return document.getElementById(`ask-${id}`);
  }

  async function addCard(id) {
    const list = $("#asks");
    if (!list || cardOf(id)) return;
    const response = await fetch(`/asks/${encodeURIComponent(id)}/card`, { credentials: "same-origin" });
    if (!response.ok || cardOf(id) || !pending.has(id)) return; // closed meanwhile
    const holder = document.createElement("div");
    holder.innerHTML = await response.text(); // the server's fragment, escaped by its templates
    const card = holder.firstElementChild;
    if (card) {
      list.append(card);
      tick();
      showCount();
    }
  }

  function removeCard(id, outcome, text) {
    const card = cardOf(id);
    const callText = card?.dataset.call || "a call";
    if (card) card.remove();
    if (page === "asks") note(id, callText, outcome, text);
    showCount();
  }

  function onMessage(message) {
    if (message.type === "opened") {
      pending.add(message.ask.id);
      if (page === "asks") addCard(message.ask.id);
    } else if (message.type === "closed") {
      pending.delete(message.id);
      if (message.answer) {
        removeCard(message.id, message.answer.accept ? "allowed" : "denied", describe(message.answer));
      } else {
        removeCard(message.id, "withdrawn", `withdrawn${message.why ? ": " + message.why : ""}`);
      }
    }
    showCount();
    if (page === "overview") refreshOverview();
  }

  function onHello(hello) {
    pending.clear();
    hello.pending.forEach((id) => pending.add(id));
    // Cards of asks that closed while the stream was down.
    document.querySelectorAll("#asks .ask").forEach((card) => {
      if (!pending.has(card.dataset.askId)) removeCard(card.dataset.askId, "withdrawn", "no longer pending");
    });
    showCount();
  }

  function connect() {
    const source = new EventSource("/events");
    source.addEventListener("open", () => {
      setLive("on", "live");
      banner("");
    });
    source.addEventListener("hello", (event) => onHello(JSON.parse(event.data)));
    source.addEventListener("message", (event) => onMessage(JSON.parse(event.data)));
    source.addEventListener("bye", () => {
      source.close();
      setLive("off", "stopped");
      banner("The workspace stopped. Start it again and run `ipybox console DIR` for a new login link.");
    });
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) {
        setLive("off", "offline");
        banner("Disconnected: the workspace stopped or this session ended. Run `ipybox console DIR` for a new login link.");
      } else {
        setLive("connecting", "reconnecting…");
      }
    });
  }

  async function answer(form, submitter) {
    const card = form.closest(".ask");
    const error = card ? $(".ask-error", card) : null;
    const buttons = card ? card.querySelectorAll("button") : [];
    buttons.forEach((button) => (button.disabled = true));
    if (error) error.hidden = true;
    let problem = null;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf, Accept: "application/json" },
        body: new URLSearchParams(new FormData(form)),
      });
      const result = await response.json().catch(() => ({ ok: false, error: `HTTP ${response.status}` }));
      if (result.ok) {
        if (card) card.dataset.state = "answered";
        if (submitter) submitter.classList.add("chosen");
        return; // the stream's `closed` event takes the card away
      }
      problem = result.error || `HTTP ${response.status}`;
    } catch (e) {
      problem = `could not reach the console (${e})`;
    }
    if (error) {
      error.textContent = problem;
      error.hidden = false;
    }
    buttons.forEach((button) => (button.disabled = false));
  }

  function tick() {
    const now = Date.now();
    document.querySelectorAll(".ask-expires[data-expires]").forEach((element) => {
      if (!element.dataset.expires) return;
      const left = Math.max(0, Math.round((Date.parse(element.dataset.expires) - now) / 1000));
      element.textContent = left ? `${left} s left` : "time is up";
    });
  }

  // -- overview

  async function refreshOverview() {
    const holder = $("#overview[data-refresh]");
    if (!holder) return;
    try {
      const response = await fetch(holder.dataset.refresh, { credentials: "same-origin" });
      if (response.ok) holder.innerHTML = await response.text(); // the server's escaped fragment
      showCount();
    } catch (e) {
      // offline: the stream's banner says so
    }
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("answer-form")) return;
    event.preventDefault();
    answer(form, event.submitter);
  });

  document.querySelectorAll("#asks .ask").forEach((card) => pending.add(card.dataset.askId));
  if (document.body.dataset.live) {
    connect();
    setInterval(tick, 1000);
    tick();
    if (page === "overview") overviewTimer = setInterval(refreshOverview, 3000);
  }
  void overviewTimer;
})();
