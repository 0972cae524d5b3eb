// The ipybox console's one script: live asks over the event stream (/events), answers without a reload,
// countdowns, the overview's refresh, the terminal's answer keys (y s a n d D on the focused ask; j/k or
// the arrows move the focus; ? help), desktop notifications and an optional sound when an ask arrives, and
// one flash message at a time. Pages work without it. Text from the server is only ever set as text
// (textContent); the only HTML inserted is the server's own rendered (escaped) fragments.
//
// Keys as in `ipybox approve`: a key answers only the focused ask, and only once that ask has been the
// focused one for SETTLE_MS (an ask can be withdrawn and another take its place just as a key lands: that
// key answers nothing, and the flash says so). A key clicks the card's own button or link for that answer,
// so it does exactly what the click does: "always" (a, D) opens the card's preview of the rule it would
// write, where nothing is written until the person saves it. Keys never act while typing in a field, nor
// with Ctrl, Alt or Meta held.
//
// Notifications are asked for only from the "Notify me" button (never on load); the choice is kept in
// localStorage ("ipybox.notify"), as is the sound's ("ipybox.sound", off unless turned on): a 0.15 s tone
// made with WebAudio, no file to load.
"use strict";

(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";
  const page = document.body.dataset.page;
  const pending = new Set();
  const known = new Set(); // asks announced (notification, tone) or already pending when the page connected
  let overviewTimer = null;
  const SETTLE_MS = 500; // as ipybox approve's SETTLE_S
  const KEYS = {
    y: "allow-once",
    s: "allow-session",
    a: "allow-always",
    n: "deny-once",
    d: "deny-session",
    D: "deny-always",
  };
  let focusedId = null;
  let chosen = false; // the person picked the focused ask (j/k, a click, a link): it stays focused
  let focusedAt = 0;

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

  // One message at a time, in the page's live region (#ask-notes, role="status"): each replaces the last,
  // and the server's flash (a reload's) goes with the first.
  function flash(text, outcome = "info", id = null) {
    const notes = $("#ask-notes");
    if (!notes) return;
    $("#messages")?.replaceChildren();
    const element = document.createElement("p");
    element.className = `ask-note ask-note-${outcome}`;
    if (id !== null) element.dataset.closedAskId = id;
    element.dataset.outcome = outcome;
    element.textContent = text;
    notes.replaceChildren(element);
  }

  function note(id, callText, outcome, text) {
    flash(`${callText}: ${text}`, outcome, id);
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
      // In the order the asks opened (the cards' fetches can come back in another).
      const order = [...pending];
      const later = cards().find((other) => order.indexOf(other.dataset.askId) > order.indexOf(id));
      list.insertBefore(card, later || null);
      prepareCard(card);
      // Until the person moves, the keys answer the oldest waiting ask (as in ipybox approve).
      if (!focusedCard() || !chosen) focusCard(cards()[0], false);
      tick();
      showCount();
    }
  }

  function removeCard(id, outcome, text) {
    const card = cardOf(id);
    const callText = card?.dataset.call || "a call";
    if (card) {
      const wasFocused = card.classList.contains("ask-focused");
      const hadFocus = card.contains(document.activeElement);
      const next = card.nextElementSibling || card.previousElementSibling;
      card.remove();
      if (wasFocused) focusCard(next, hadFocus);
    }
    if (page === "asks") note(id, callText, outcome, text);
    showCount();
  }

  // -- the focused ask and the keys

  function cards() {
    return [...document.querySelectorAll("#asks .ask")];
  }

  function focusedCard() {
    return focusedId === null ? null : cardOf(focusedId);
  }

  // Marks `card` as the one the keys answer; `moveFocus` also moves the keyboard focus onto it (keys that
  // move between asks do; an ask arriving or leaving does not take the focus from where it is).
  function focusCard(card, moveFocus) {
    cards().forEach((other) => {
      if (other !== card) {
        other.classList.remove("ask-focused");
        other.removeAttribute("aria-current");
      }
    });
    if (!card) {
      focusedId = null;
      return;
    }
    card.classList.add("ask-focused");
    card.setAttribute("aria-current", "true");
    if (card.dataset.askId !== focusedId) {
      focusedId = card.dataset.askId;
      focusedAt = Date.now();
    }
    if (moveFocus) {
      card.focus({ preventScroll: true });
      card.scrollIntoView({ block: "nearest" });
    }
  }

  // Each answer control gets its key: shown on the button (data-key, see console.css) and announced
  // (aria-keyshortcuts).
  function prepareCard(card) {
    if (!card.hasAttribute("tabindex")) card.tabIndex = -1;
    scrollablesFocusable(card);
    for (const [key, action] of Object.entries(KEYS)) {
      card.querySelectorAll(`[data-action="${action}"]`).forEach((control) => {
        control.dataset.key = key;
        control.setAttribute("aria-keyshortcuts", key === "D" ? "Shift+D" : key);
      });
    }
  }

  // A long value scrolls inside its own box: the keyboard can scroll it once it can take the focus.
  function scrollablesFocusable(root = document) {
    root.querySelectorAll("details pre").forEach((box) => {
      if (!box.hasAttribute("tabindex")) box.tabIndex = 0;
    });
  }

  function move(step) {
    chosen = true;
    const all = cards();
    if (!all.length) return;
    const at = all.indexOf(focusedCard());
    const next = at < 0 ? 0 : Math.min(all.length - 1, Math.max(0, at + step));
    focusCard(all[next], true);
  }

  function typing(target) {
    if (!(target instanceof Element)) return false;
    return Boolean(target.closest("input, textarea, select, [contenteditable]:not([contenteditable='false'])"));
  }

  function answerByKey(key) {
    const card = focusedCard();
    if (!card) {
      flash("No ask is waiting.");
      return;
    }
    if (card.dataset.state === "answered") return;
    if (Date.now() - focusedAt < SETTLE_MS) {
      flash("The ask changed: look again.", "warning");
      focusedAt = Date.now();
      return;
    }
    const control = card.querySelector(`[data-action="${KEYS[key]}"]`);
    if (!control || control.disabled) return;
    control.click();
  }

  function toggleHelp() {
    const help = $("#keys-help");
    if (!help) return;
    if (help.open) help.close();
    else help.showModal();
  }

  function onKey(event) {
    if (event.defaultPrevented || event.ctrlKey || event.altKey || event.metaKey) return;
    if (typing(event.target)) return;
    if ($("#keys-help")?.open) return; // the dialog's own keys (Esc closes it)
    const key = event.key;
    if (key === "?") {
      event.preventDefault();
      toggleHelp();
      return;
    }
    if (page !== "asks") return;
    if (key === "j" || key === "ArrowDown") {
      if (!cards().length) return;
      event.preventDefault();
      move(1);
    } else if (key === "k" || key === "ArrowUp") {
      if (!cards().length) return;
      event.preventDefault();
      move(-1);
    } else if (Object.hasOwn(KEYS, key)) {
      if (event.repeat) return;
      event.preventDefault();
      answerByKey(key);
    }
  }

  // -- notifications and sound

  const store = {
    get(name) {
      try {
        return localStorage.getItem(`ipybox.${name}`);
      } catch (e) {
        return null;
      }
    },
    set(name, value) {
      try {
        localStorage.setItem(`ipybox.${name}`, value);
      } catch (e) {
        // private mode: the choice lasts for this page only
      }
    },
  };
  let audio = null;

  function notifying() {
    return "Notification" in window && Notification.permission === "granted" && store.get("notify") === "on";
  }

  function showAlertControls() {
    const notify = $("#notify-toggle");
    if (notify) {
      if (!("Notification" in window)) {
        notify.hidden = true;
      } else {
        notify.hidden = false;
        const denied = Notification.permission === "denied";
        notify.disabled = denied;
        notify.setAttribute("aria-pressed", String(notifying()));
        notify.textContent = denied ? "Notifications blocked" : notifying() ? "Notifications on" : "Notify me";
        notify.title = denied
          ? "This browser was told not to show this site's notifications: allow them in its site settings"
          : "A desktop notification when a call waits for an answer";
      }
    }
    const sound = $("#sound-toggle");
    if (sound) {
      sound.hidden = false;
      const on = store.get("sound") === "on";
      sound.setAttribute("aria-pressed", String(on));
      sound.textContent = on ? "Sound on" : "Sound off";
    }
  }

  async function toggleNotify() {
    if (!("Notification" in window)) return;
    if (notifying()) {
      store.set("notify", "off");
    } else {
      const permission =
        Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
      store.set("notify", permission === "granted" ? "on" : "off");
    }
    showAlertControls();
  }

  function toggleSound() {
    const on = store.get("sound") !== "on";
    store.set("sound", on ? "on" : "off");
    showAlertControls();
    if (on) beep(); // a sample, and the click lets the page play sound from now on
  }

  function beep() {
    try {
      audio ??= new AudioContext();
      if (audio.state === "suspended") audio.resume();
      const tone = audio.createOscillator();
      const gain = audio.createGain();
      const now = audio.currentTime;
      tone.frequency.value = 880;
      gain.gain.setValueAtTime(0.0001, now);
      gain.gain.exponentialRampToValueAtTime(0.2, now + 0.02);
      gain.gain.exponentialRampToValueAtTime(0.0001, now + 0.15);
      tone.connect(gain).connect(audio.destination);
      tone.start(now);
      tone.stop(now + 0.16);
    } catch (e) {
      // no audio here: the notification and the title still tell
    }
  }

  function alertOf(ask) {
    if (store.get("sound") === "on") beep();
    if (!notifying()) return;
    try {
      const what = ask.subject ?? `${ask.server}.${ask.tool}`;
      const notification = new Notification("ipybox: a call waits for your answer", {
        body: `${what}${ask.reason ? ` (${ask.reason})` : ""}`,
        tag: `ipybox-ask-${ask.id}`, // one notification per ask, however many console pages are open
        icon: "/static/favicon.svg",
      });
      notification.addEventListener("click", () => {
        window.focus();
        if (page === "asks") focusCard(cardOf(ask.id), true);
        else location.assign(`/asks#ask-${ask.id}`);
        notification.close();
      });
    } catch (e) {
      // a browser that only notifies from a service worker: the title and the sound still tell
    }
  }

  function onMessage(message) {
    if (message.type === "opened") {
      // The stream repeats the asks pending when it (re)connected: those are on the page, not news.
      if (!known.has(message.ask.id)) alertOf(message.ask);
      known.add(message.ask.id);
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
    hello.pending.forEach((id) => {
      pending.add(id);
      known.add(id);
    });
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

  document.addEventListener("keydown", onKey);
  document.addEventListener("focusin", (event) => {
    const card = event.target instanceof Element ? event.target.closest("#asks .ask") : null;
    if (card && card !== focusedCard()) {
      chosen = true;
      focusCard(card, false);
    }
  });
  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    if (target?.closest("#notify-toggle")) toggleNotify();
    else if (target?.closest("#sound-toggle")) toggleSound();
    else if (target?.closest("#keys-help-open")) toggleHelp();
    else if (target?.closest("#keys-help-close")) $("#keys-help")?.close();
  });
  showAlertControls();

  document.querySelectorAll("#asks .ask").forEach((card) => {
    pending.add(card.dataset.askId);
    prepareCard(card);
  });
  scrollablesFocusable();
  const linked = location.hash.startsWith("#ask-") ? document.getElementById(location.hash.slice(1)) : null;
  chosen = Boolean(linked?.matches("#asks .ask"));
  focusCard(chosen ? linked : cards()[0] || null, chosen);
  if (document.body.dataset.live) {
    connect();
    setInterval(tick, 1000);
    tick();
    if (page === "overview") overviewTimer = setInterval(refreshOverview, 3000);
  }
  void overviewTimer;
})();
